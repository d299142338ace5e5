package confine

import (
	"errors"
	"fmt"
	"slices"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The syscall filter is assembled with github.com/elastic/go-seccomp-bpf:
// pure Go (berth-agent is a static binary that also runs in the scratch
// container image, so libseccomp and cgo are out), maintained (Beats load
// their own filter with it), with syscall tables generated from the kernel's
// and argument conditions (for clone and unshare). It loads the filter with
// SECCOMP_FILTER_FLAG_TSYNC, so every thread of the agent, and every process
// it starts, is filtered. docs/adr/0012-host-run-namespaces-and-seccomp.md.

// Refused lists the syscalls the filter refuses with EPERM: what container
// runtimes' default profiles refuse (or grant only with a capability an
// agent never holds), and nothing berth-agent, its tool launcher, its egress
// proxy or a shell tool needs. Names the running architecture does not have
// are left out.
var Refused = []string{
	// Kernel keyrings are not namespaced: one agent could leave a key for
	// another.
	"keyctl", "add_key", "request_key",
	// Mounts and the root: a run's mount namespace is made before the filter.
	"mount", "umount", "umount2", "pivot_root", "chroot",
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
	// Namespaces: entering one, or unsharing with a namespace flag (clone
	// and unshare with namespace flags are refused by NamespaceFlags).
	"setns",
	// The machine itself.
	"reboot", "kexec_load", "kexec_file_load", "swapon", "swapoff",
	"init_module", "finit_module", "delete_module", "create_module", "get_kernel_syms", "query_module",
	"acct", "quotactl", "quotactl_fd", "nfsservctl", "vhangup", "sethostname", "setdomainname",
	"clock_settime", "clock_adjtime", "settimeofday", "stime",
	"iopl", "ioperm", "syslog", "lookup_dcookie", "uselib", "ustat", "sysfs", "_sysctl",
	// Kernel attack surface a sandboxed agent has no use for.
	"bpf", "perf_event_open", "userfaultfd", "fanotify_init",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	// Files by handle bypass the path walk (and Landlock's rules with it).
	"open_by_handle_at", "name_to_handle_at",
}

// NamespaceFlags are the clone/unshare flags that make a namespace (CLONE_NEWNS,
// NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: the mask Docker's
// profile uses); unshare also refuses CLONE_NEWTIME.
const NamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// actionENOSYS makes clone3 look absent: its flags sit in a struct the filter
// cannot read, and libc falls back to clone (whose flags it can) on ENOSYS.
const actionENOSYS = seccomp.Action(unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS))

// FilterPolicy is the syscall filter: everything is allowed but Refused and
// namespace-making clone/unshare (EPERM) and clone3 (ENOSYS).
func FilterPolicy() (seccomp.Policy, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return seccomp.Policy{}, fmt.Errorf("cannot find the syscall table of this architecture: %w", err)
	}
	var names []string
	for _, n := range Refused {
		if _, ok := info.SyscallNames[n]; ok && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	for _, must := range []string{"keyctl", "add_key", "request_key", "mount", "setns", "unshare", "clone"} {
		if _, ok := info.SyscallNames[must]; !ok {
			return seccomp.Policy{}, fmt.Errorf("cannot filter syscalls on %s: its table has no %s", info.Name, must)
		}
	}
	refuse := seccomp.SyscallGroup{Action: seccomp.ActionErrno, Names: names, NamesWithCondtions: []seccomp.NameWithConditions{
		{Name: "clone", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: NamespaceFlags}}},
		{Name: "unshare", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: NamespaceFlags | unix.CLONE_NEWTIME}}},
	}}
	p := seccomp.Policy{DefaultAction: seccomp.ActionAllow, Syscalls: []seccomp.SyscallGroup{refuse}}
	if _, ok := info.SyscallNames["clone3"]; ok {
		p.Syscalls = append(p.Syscalls, seccomp.SyscallGroup{Action: actionENOSYS, Names: []string{"clone3"}})
	}
	return p, nil
}

// InstallFilter loads the syscall filter into every thread of the calling
// process (and so into every process it starts from now on). Call it after
// Landlock (Enforce sets no_new_privs, which an unprivileged process needs to
// load a filter) and before the first tool runs. A filter cannot be removed.
func InstallFilter() error {
	p, err := FilterPolicy()
	if err != nil {
		return err
	}
	if err := seccomp.LoadFilter(seccomp.Filter{NoNewPrivs: true, Flag: seccomp.FilterFlagTSync, Policy: p}); err != nil {
		return fmt.Errorf("cannot install the syscall filter: %w", err)
	}
	// The library's filter allows whatever comes with another audit
	// architecture (its table is the native one): without this second
	// filter a 32-bit call (int 0x80 on x86_64) would reach keyctl.
	if err := refuseForeignArch(); err != nil {
		return fmt.Errorf("cannot install the syscall filter: %w", err)
	}
	return nil
}

// refuseForeignArch loads a filter that refuses (EPERM) every syscall made
// with another audit architecture than the native one.
func refuseForeignArch() error {
	info, err := arch.GetInfo("")
	if err != nil {
		return err
	}
	raw, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW},
	})
	if err != nil {
		return err
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	tid, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	switch {
	case e == unix.ENOSYS:
		return errors.New("the kernel has no seccomp")
	case e != 0:
		return fmt.Errorf("cannot refuse other architectures' syscalls: %w", e)
	case tid != 0:
		// TSYNC names the thread it could not give the filter to.
		return fmt.Errorf("cannot refuse other architectures' syscalls: thread %d has another filter", tid)
	}
	return nil
}
