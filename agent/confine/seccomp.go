package confine

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The syscall filter is assembled at build time (package syscallfilter,
// with github.com/elastic/go-seccomp-bpf; `go generate` writes
// zfilter_<goarch>.go): it is the same for every run on an architecture, and
// the library's start-up (syscall tables of every architecture) cost each
// run more than loading the filter. InstallFilter loads it with
// SECCOMP_FILTER_FLAG_TSYNC, so every thread of the agent, and every process
// it starts, is filtered. The list it refuses is hostsandbox.Refused, which
// the host summarises too (Explain). docs/adr/0012-host-run-namespaces-and-seccomp.md.
//
//go:generate go run ./internal/genfilter

// InstallFilter sets no_new_privs (which an unprivileged process needs to
// load a filter) and loads the syscall filter into every thread of the
// calling process (and so into every process it starts from now on); the
// kernel's TSYNC gives no_new_privs to every thread with it. Enforce calls
// it before Landlock, whose per-thread enforcement needs that bit on each
// thread. A filter cannot be removed.
func InstallFilter() error {
	if len(generatedProgram) == 0 {
		return fmt.Errorf("cannot install the syscall filter: berth-agent has none for %s", runtime.GOARCH)
	}
	// no_new_privs and the filter on one thread; TSYNC then gives the
	// filter (and no_new_privs) to every other thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("cannot install the syscall filter: failed to set no_new_privs with prctl: %w", err)
	}
	// generatedProgram refuses every syscall of another audit architecture
	// (a 32-bit call on x86_64 would otherwise reach keyctl), then runs
	// go-seccomp-bpf's program for the native one.
	if err := loadFilter(generatedProgram); err != nil {
		return fmt.Errorf("cannot install the syscall filter: %w", err)
	}
	return nil
}

// loadFilter loads a BPF program into every thread (SECCOMP_FILTER_FLAG_TSYNC).
func loadFilter(filter []unix.SockFilter) error {
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	tid, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	switch {
	case e == unix.ENOSYS:
		return errors.New("the kernel has no seccomp")
	case e != 0:
		return fmt.Errorf("failed loading seccomp filter: %w", e)
	case tid != 0:
		// TSYNC names the thread it could not give the filter to.
		return fmt.Errorf("thread %d has another filter", tid)
	}
	return nil
}
