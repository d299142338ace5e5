package hostrun

import (
	"fmt"
	"os"
	"strings"

	"github.com/berth-dev/berth/internal/hostsandbox"
	"github.com/berth-dev/berth/isolation"
)

// sandboxHolds says which namespaces and filters confine a plan's host run
// beyond its limits (for Explain); unit says the run is a transient unit.
func sandboxHolds(p isolation.Plan, unit bool) (holds, missing []string) {
	if p.Policy.Unrestricted {
		return nil, []string{
			"mount namespace: an unrestricted run sees the host's sockets (/run: the system bus, the journal, every service)",
			"IPC namespace: an unrestricted run shares SysV IPC with the host",
			"syscall filter: an unrestricted run has none",
		}
	}
	var dirs, scratch []string
	for _, m := range masks(p) {
		dirs = append(dirs, m.Path)
		if m.Scratch {
			scratch = append(scratch, m.Path)
		}
	}
	keeps := boundBack(p)
	shown := ""
	if len(keeps) > 0 {
		shown = "; bound back: " + strings.Join(keeps, ", ")
	}
	if len(scratch) > 0 {
		holds = append(holds, fmt.Sprintf("%s: fresh tmpfs of the run's own (%s each, read-write, gone with the run); TMPDIR=/tmp", strings.Join(scratch, " and "), hostsandbox.ScratchSize))
	}
	if unit {
		holds = append(holds,
			fmt.Sprintf("TemporaryFileSystem=%s (the host's sockets are hidden%s)", strings.Join(dirs, " "), shown),
			"PrivateIPC=yes (SysV IPC and POSIX message queues of the run's own)",
			"KeyringMode=private",
		)
	} else {
		who := "by the scheduler, before the agent starts"
		if os.Geteuid() != 0 {
			who = "by berth-agent in a user namespace of its own, before it reads on (the scheduler is not root)"
		}
		holds = append(holds,
			fmt.Sprintf("mount namespace: %s are empty tmpfs, made %s (the host's sockets are hidden%s)", strings.Join(dirs, ", "), who, shown),
			"IPC namespace of the run's own (SysV IPC and POSIX message queues)",
		)
	}
	holds = append(holds, filterHolds())
	return holds, missing
}

// filterHolds describes berth-agent's syscall filter.
func filterHolds() string {
	n := len(hostsandbox.RefusedHere())
	return fmt.Sprintf("syscall filter (seccomp, set by berth-agent just before Landlock, inherited by every tool): %d syscalls refused with EPERM — "+
		"keyrings (keyctl, add_key, request_key), mounts, setns and namespace flags of clone/unshare, modules, kexec, reboot, swap, "+
		"bpf, perf_event_open, userfaultfd, io_uring, clock setting, open_by_handle_at; clone3 answers ENOSYS; "+
		"other architectures' syscalls are refused", n)
}
