package hostsandbox

import "slices"

// Refused lists the syscalls berth-agent's filter refuses with EPERM: what
// container runtimes' default profiles refuse (or grant only with a
// capability an agent never holds), and nothing berth-agent, its tool
// launcher, its egress proxy or a shell tool needs. Names the running
// architecture does not have are left out (RefusedHere). clone and unshare
// with a namespace flag are refused too, and clone3 answers ENOSYS (its
// flags sit in a struct the filter cannot read; libc falls back to clone).
// agent/confine loads the program assembled from this list at build time
// (go generate ./agent/confine writes zrefused_<goarch>.go here too).
var Refused = []string{
	// Kernel keyrings are not namespaced: one agent could leave a key for
	// another.
	"keyctl", "add_key", "request_key",
	// Mounts and the root: a run's mount namespace is made before the filter.
	"mount", "umount", "umount2", "pivot_root", "chroot",
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
	// Namespaces: entering one, or unsharing with a namespace flag (clone
	// and unshare with namespace flags are refused by their flags).
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

// RefusedHere are the names of Refused this architecture has: what the
// filter refuses with EPERM here (besides namespace-making clone/unshare).
// It is empty where berth-agent has no filter (it then refuses to run).
func RefusedHere() []string {
	return slices.Clone(generatedRefused)
}
