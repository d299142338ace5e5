package hostrun

import (
	"fmt"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/isolation"
)

// A confined host run (not an unrestricted one) gets a mount namespace in
// which the host's socket directories are empty tmpfs (confine.MaskedDirs,
// only the plan's own paths bound back) and an IPC namespace of its own (no
// SysV queue, semaphore or shared memory segment of another run or of the
// host). berth-agent adds a syscall filter itself (confine.InstallFilter).
//
// A root scheduler makes both namespaces on the locked thread that starts
// the agent (as it does the network namespace with loopback) and masks
// there: the agent is born masked. A non-root scheduler cannot unshare a
// user namespace from a threaded process, so the agent is cloned into new
// user, mount and IPC namespaces with an ambient CAP_SYS_ADMIN, and
// berth-agent masks itself (confine.MaskEnv) before it drops every
// capability and reads on.

// isolatesHost says whether a run gets the mount and IPC namespaces:
// every run but an unrestricted one.
func isolatesHost(spec isolation.Spec) bool { return !spec.Policy.Unrestricted }

// keepVisible are the paths of a run's plan the masks must not hide
// (confine.KeepVisible, as berth-agent masking itself keeps them).
func keepVisible(p isolation.Plan) []string {
	socket := ""
	if p.Egress != nil {
		socket = p.Egress.SandboxSocket
	}
	return confine.KeepVisible(p.Workspace, p.AgentBinary, p.Policy, socket)
}

// boundBack are the paths of a plan that the masks would hide, as they are
// after links (the resolver's file /etc/resolv.conf points to): bound back
// after the masks, so they stay where they were.
func boundBack(p isolation.Plan) []string {
	return confine.KeepPaths(confine.Masked(), keepVisible(p))
}

// masks are the directories a run's masks cover: those of this host but,
// for a unit, those under /tmp, which PrivateTmp makes fresh already.
func masks(unit bool) []confine.MaskedDir {
	return slices.DeleteFunc(confine.Masked(), func(m confine.MaskedDir) bool {
		return unit && strings.HasPrefix(m.Path, "/tmp/")
	})
}

// enterMaskedNamespaces moves the calling thread (locked, and ended with the
// run) into new mount and IPC namespaces and masks the host's socket
// directories there; a child started from the thread is born in them.
func enterMaskedNamespaces(p isolation.Plan) error {
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_NEWIPC); err != nil {
		return fmt.Errorf("cannot make mount and IPC namespaces: %w", err)
	}
	if _, err := confine.MaskSocketDirs(keepVisible(p)); err != nil {
		return err
	}
	return nil
}

// userNamespace makes the child's clone create a user namespace mapping only
// the scheduler's own uid and gid, with namespaces flags inside it; caps are
// the ambient capabilities berth-agent gets there (it drops them all before
// it reads the request's tools).
func userNamespace(attr *syscall.SysProcAttr, flags uintptr, caps []uintptr) {
	uid, gid := syscall.Geteuid(), syscall.Getegid()
	attr.Cloneflags |= syscall.CLONE_NEWUSER | flags
	attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
	attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
	attr.GidMappingsEnableSetgroups = false
	for _, c := range caps {
		if !slices.Contains(attr.AmbientCaps, c) {
			attr.AmbientCaps = append(attr.AmbientCaps, c)
		}
	}
}

// tmpfsMount is one entry of TemporaryFileSystem (D-Bus signature (ss)):
// the path and its mount options.
type tmpfsMount struct {
	Path, Options string
}

// unitMasks are the TemporaryFileSystem entries of a confined unit.
func unitMasks() []tmpfsMount {
	out := []tmpfsMount{}
	for _, m := range masks(true) {
		out = append(out, tmpfsMount{Path: m.Path, Options: "mode=" + m.Mode + ",size=" + m.Size + ",nosuid,nodev,noexec"})
	}
	return out
}
