package confine

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// Enforce loads the filter first and lets its TSYNC give no_new_privs to
// every thread, then restricts each thread with Landlock: every thread of
// the process, including ones locked elsewhere while Enforce ran, must end
// with no_new_privs, the filter and the Landlock domain. A syscall of
// another architecture (int 0x80 on amd64) is refused.
func TestEveryThreadEndsWithNoNewPrivsTheFilterAndLandlock(t *testing.T) {
	t.Parallel()
	if abi := KernelABI(); abi < MinNetworkABI {
		testenv.Need(t, false, "kernel Landlock ABI is %d, the test needs %d", abi, MinNetworkABI)
	}
	dir, err := testenv.OpenDir("berth-confine-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin, err := testenv.BuildStatic(dir, "enforcer", "./testdata/enforcer")
	if err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(dir, "outside.txt")
	if err := os.WriteFile(outside, []byte("not in the policy\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The same file is readable without the sandbox.
	if _, err := os.ReadFile(outside); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, outside)
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("enforcer: %v\n%s", err, out)
	}
	var threads, tasks int
	var foreign bool
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		switch {
		case strings.HasPrefix(line, "thread open: "):
			threads++
			if !strings.Contains(line, "permission denied") {
				t.Errorf("a thread locked during Enforce read a file outside the policy: %s", line)
			}
		case strings.HasPrefix(line, "foreign getpid before: "):
			t.Logf("a 32-bit syscall before Enforce: %s", line)
		case strings.HasPrefix(line, "foreign getpid after: "):
			foreign = true
			// -EPERM from the filter's guard; anything else (the pid, or
			// the kernel's own -ENOSYS) means the call got past it.
			if line != "foreign getpid after: -1" {
				t.Errorf("a 32-bit syscall after Enforce was not refused with EPERM: %s", line)
			}
		case strings.HasPrefix(line, "task "):
			tasks++
			if !strings.Contains(line, "NoNewPrivs: 1") || !strings.Contains(line, "Seccomp: 2") || !strings.Contains(line, "Seccomp_filters: 1") {
				t.Errorf("a thread is not filtered with no_new_privs: %s", line)
			}
		default:
			t.Errorf("unexpected output: %s", line)
		}
	}
	if runtime.GOARCH == "amd64" && !foreign {
		t.Errorf("the enforcer made no 32-bit syscall:\n%s", out)
	}
	if threads != 4 || tasks < 5 {
		t.Errorf("saw %d locked threads and %d tasks, want 4 and at least 5:\n%s", threads, tasks, out)
	}
}
