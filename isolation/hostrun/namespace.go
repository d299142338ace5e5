package hostrun

import (
	"fmt"
	"path/filepath"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/hostsandbox"
	"github.com/berth-dev/berth/isolation"
)

// A confined host run (not an unrestricted one) gets a mount namespace in
// which the host's socket directories are empty tmpfs (hostsandbox.MaskedDirs,
// only the plan's own paths bound back), /tmp and /var/tmp are fresh tmpfs
// of 256 MiB of its own, the directory of every run's egress directory shows
// only its own, and an IPC namespace of its own (no SysV queue, semaphore or
// shared memory segment of another run or of the host). berth-agent adds a
// syscall filter itself (hostsandbox.Refused, loaded by agent/confine).
//
// A root scheduler makes both namespaces on the locked thread that starts
// the agent (as it does the network namespace with loopback) and masks
// there: the agent is born masked. A non-root scheduler cannot unshare a
// user namespace from a threaded process, so the agent is cloned into new
// user, mount and IPC namespaces with an ambient CAP_SYS_ADMIN, and
// berth-agent masks itself (hostsandbox.MaskEnv) before it drops every
// capability and reads on. Under systemd the unit's TemporaryFileSystem=
// does the same (unit.go).

// isolatesHost says whether a run gets the mount and IPC namespaces:
// every run but an unrestricted one.
func isolatesHost(spec isolation.Spec) bool { return !spec.Policy.Unrestricted }

// egressSocket is the plan's egress socket as the sandbox sees it, "" for
// a run without one.
func egressSocket(p isolation.Plan) string {
	if p.Egress == nil {
		return ""
	}
	return p.Egress.SandboxSocket
}

// keepVisible are the paths of a run's plan the masks must not hide
// (hostsandbox.KeepVisible, as berth-agent masking itself keeps them).
func keepVisible(p isolation.Plan) []string {
	return hostsandbox.KeepVisible(p.Workspace, p.AgentBinary, p.Policy, egressSocket(p))
}

// masks are the directories a run's masks cover (hostsandbox.RunMasks).
func masks(p isolation.Plan) []hostsandbox.MaskedDir {
	return hostsandbox.RunMasks(egressSocket(p))
}

// boundBack are the paths of a plan that the masks would hide, as they are
// after links (the resolver's file /etc/resolv.conf points to): bound back
// after the masks, so they stay where they were.
func boundBack(p isolation.Plan) []string {
	return hostsandbox.KeepPaths(masks(p), keepVisible(p))
}

// withScratch is a confined run's policy with its own /tmp and /var/tmp
// read-write: they are fresh tmpfs of the run (the masks), so nothing of the
// host's or another run's is there to reach.
func withScratch(p agentproto.Policy) agentproto.Policy {
	if p.Unrestricted {
		return p
	}
	scratch := hostsandbox.ScratchDirs(hostsandbox.Masked())
	p.AllowReadWrite = append(slices.DeleteFunc(slices.Clone(p.AllowReadWrite), func(path string) bool {
		return slices.Contains(scratch, filepath.Clean(path))
	}), scratch...)
	return p
}

// enterMaskedNamespaces moves the calling thread (locked, and ended with the
// run) into new mount and IPC namespaces and masks the host's socket
// directories there; a child started from the thread is born in them.
func enterMaskedNamespaces(p isolation.Plan) error {
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_NEWIPC); err != nil {
		return fmt.Errorf("cannot make mount and IPC namespaces: %w", err)
	}
	if _, err := hostsandbox.MaskSocketDirs(masks(p), keepVisible(p), hostsandbox.KeepWritable(p.Workspace, p.Policy, egressSocket(p))); err != nil {
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
func unitMasks(p isolation.Plan) []tmpfsMount {
	out := []tmpfsMount{}
	for _, m := range masks(p) {
		out = append(out, tmpfsMount{Path: m.Path, Options: m.UnitOptions()})
	}
	return out
}

// unmasked is paths less the masked directories themselves: a bind of /tmp
// onto /tmp would put the host's back over the run's own.
func unmasked(paths []string, masks []hostsandbox.MaskedDir) []string {
	return slices.DeleteFunc(slices.Clone(paths), func(path string) bool {
		return slices.ContainsFunc(masks, func(m hostsandbox.MaskedDir) bool { return m.Path == filepath.Clean(path) })
	})
}
