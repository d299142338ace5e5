package confine

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/hostsandbox"
)

// MaskSelf masks the host's socket directories when the runner asked for it
// (hostsandbox.MaskEnv: a non-root scheduler started berth-agent in user, mount and IPC
// namespaces of its own, with CAP_SYS_ADMIN there) and the other runs' egress
// directories (hostsandbox.RunMasks), keeping visible what the
// request names: its workspace, its policy's allow paths, its egress socket's
// directory and berth-agent itself. It then gives up CAP_SYS_ADMIN (every
// capability but CAP_NET_ADMIN, which the egress proxy's loopback still needs
// and drops right after). Without hostsandbox.MaskEnv it does nothing: a root scheduler
// or systemd masked already. It returns what it masked.
func MaskSelf(req agentproto.Request) ([]string, error) {
	if os.Getenv(hostsandbox.MaskEnv) == "" {
		return nil, nil
	}
	os.Unsetenv(hostsandbox.MaskEnv)
	// Masking in the host's own mount namespace (a root berth-agent started
	// by hand with hostsandbox.MaskEnv) would hide /run from the whole machine.
	if initial, err := inInitialUserNamespace(); err != nil || initial {
		return nil, fmt.Errorf("refusing to mask the socket directories: %s is set but berth-agent is not in a user namespace of its own (%v)", hostsandbox.MaskEnv, err)
	}
	self, _ := os.Executable() // "" when unknown: KeepPaths skips it
	var egressSocket string
	if req.Egress != nil {
		egressSocket = req.Egress.Socket
	}
	masked, err := hostsandbox.MaskSocketDirs(hostsandbox.RunMasks(egressSocket), hostsandbox.KeepVisible(req.Workspace, self, req.Policy, egressSocket),
		hostsandbox.KeepWritable(req.Workspace, req.Policy, egressSocket))
	if err != nil {
		return masked, err
	}
	if err := keepOnlyNetAdmin(); err != nil {
		return masked, err
	}
	return masked, nil
}

// keepOnlyNetAdmin drops every capability of every thread but CAP_NET_ADMIN
// (where held), from the ambient set too: nothing the tools start with
// could mount again.
func keepOnlyNetAdmin() error {
	if _, _, e := syscall.AllThreadsSyscall6(syscall.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_LOWER, unix.CAP_SYS_ADMIN, 0, 0, 0); e != 0 {
		return fmt.Errorf("cannot drop CAP_SYS_ADMIN from the ambient set: %w", e)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("cannot read capabilities: %w", err)
	}
	const netAdmin = 1 << unix.CAP_NET_ADMIN // CAP_NET_ADMIN (12) is in the first word
	for i := range data {
		keep := uint32(0)
		if i == 0 {
			keep = netAdmin
		}
		data[i].Effective &= keep
		data[i].Permitted &= keep
		data[i].Inheritable &= keep
	}
	if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("cannot drop CAP_SYS_ADMIN: %w", e)
	}
	return nil
}

// inInitialUserNamespace reports whether the process is in the initial user
// namespace, whose uid_map maps all of 0-4294967294 to itself.
func inInitialUserNamespace() (bool, error) {
	data, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return false, fmt.Errorf("cannot read uid_map: %w", err)
	}
	return strings.Join(strings.Fields(string(data)), " ") == "0 0 4294967295", nil
}
