package hostsandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/agentproto"
)

// A host run's named Unix sockets are out of reach by mounts, not Landlock
// (before ABI 9 Landlock does not govern connect() on a path socket): in the
// run's own mount namespace the directories that hold the host's sockets are
// empty tmpfs, and only the paths the run's plan names are bound back into
// them. The scheduler does it for a root host run, on the thread that starts
// the agent; berth-agent does it itself when a non-root scheduler started it
// in a user namespace of its own (MaskEnv). So a socket in a masked directory
// is reachable only where the plan names it (its file rules); one elsewhere
// on the host is as reachable as its file permissions make it.

// MaskedDir is a directory a host run sees as an empty tmpfs.
type MaskedDir struct {
	Path string
	// Mode and Size are the tmpfs's mount options.
	Mode string
	Size string
	// Scratch marks the run's own /tmp and /var/tmp: the agent may write
	// there (its Landlock rules grant it read-write) and run what it wrote,
	// as in a container's /tmp; the socket masks are noexec.
	Scratch bool
}

// ScratchSize is the size of a host run's /tmp and /var/tmp, as the
// container's /tmp.
const ScratchSize = "256m"

// MaskedDirs are the socket directories of the host: /run (the system bus,
// the journal, systemd's and every service's sockets, users' runtime dirs),
// /var/run when it is not a link to /run, /tmp and /var/tmp (a world-writable
// socket there — PostgreSQL's, tmux's, an X server's, a private bus — is
// reachable by any user; the run gets fresh ones of its own), X11 and ICE
// sockets (only where /tmp is not masked as a whole), and /dev/shm (POSIX
// shared memory, which the run's IPC namespace does not cover). Missing ones
// are skipped.
var MaskedDirs = []MaskedDir{
	{Path: "/run", Mode: "0755", Size: "1m"},
	{Path: "/var/run", Mode: "0755", Size: "1m"},
	{Path: "/tmp", Mode: "1777", Size: ScratchSize, Scratch: true},
	{Path: "/var/tmp", Mode: "1777", Size: ScratchSize, Scratch: true},
	{Path: "/tmp/.X11-unix", Mode: "1777", Size: "64k"},
	{Path: "/tmp/.ICE-unix", Mode: "1777", Size: "64k"},
	{Path: "/dev/shm", Mode: "1777", Size: "64m"},
}

// mountOptions are the tmpfs options of m, in mount(8)'s and systemd's
// TemporaryFileSystem= syntax (without the flags).
func (m MaskedDir) mountOptions() string { return "mode=" + m.Mode + ",size=" + m.Size }

// mountFlags are the tmpfs's flags: no set-uid files or devices anywhere,
// and nothing run from a socket mask.
func (m MaskedDir) mountFlags() uintptr {
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if !m.Scratch {
		flags |= unix.MS_NOEXEC
	}
	return flags
}

// UnitOptions are m's options as a TemporaryFileSystem= entry takes them.
func (m MaskedDir) UnitOptions() string {
	opts := m.mountOptions() + ",nosuid,nodev"
	if !m.Scratch {
		opts += ",noexec"
	}
	return opts
}

// MaskEnv, set to "1" in berth-agent's environment, tells it that it runs in
// a user and mount namespace of its own with CAP_SYS_ADMIN there, and must
// mask MaskedDirs itself before anything else (MaskSocketDirs), then drop
// every capability. berth-agent removes it from its environment.
const MaskEnv = "BERTH_MASK_SOCKET_DIRS"

// Masked reports the directories of MaskedDirs that exist here as
// directories of their own (not links), in order, but those inside another
// one (a mask over /tmp hides /tmp/.X11-unix already): what MaskSocketDirs
// masks.
func Masked() []MaskedDir {
	var out []MaskedDir
	for _, m := range MaskedDirs {
		fi, err := os.Lstat(m.Path)
		if err != nil || !fi.IsDir() || insideAny(out, m.Path) {
			continue
		}
		out = append(out, m)
	}
	return out
}

// RunMasks are Masked plus the directory holding every run's egress
// directory (the parent of egressSocket's directory; egressSocket "" for a
// run without one): a run sees its own egress directory there, bound back,
// and no other run's socket. A root that lies inside a mask is hidden
// already; one that is / or holds a masked directory is left alone (an
// egress_dir that odd would hide the system with it).
func RunMasks(egressSocket string) []MaskedDir {
	masks := Masked()
	if egressSocket == "" || !filepath.IsAbs(egressSocket) {
		return masks
	}
	root := filepath.Dir(filepath.Dir(filepath.Clean(egressSocket)))
	if real, err := filepath.EvalSymlinks(root); err == nil {
		root = real
	}
	if root == "/" || insideAny(masks, root) {
		return masks
	}
	for _, m := range masks {
		if m.Path == root || strings.HasPrefix(m.Path, root+"/") {
			return masks
		}
	}
	if fi, err := os.Lstat(root); err != nil || !fi.IsDir() {
		return masks
	}
	return append(masks, MaskedDir{Path: root, Mode: "0755", Size: "1m"})
}

// ScratchDirs are the paths of the scratch masks among masks: the run's own
// /tmp and /var/tmp, which its Landlock rules make read-write.
func ScratchDirs(masks []MaskedDir) []string {
	var out []string
	for _, m := range masks {
		if m.Scratch {
			out = append(out, m.Path)
		}
	}
	return out
}

// insideAny says whether path lies strictly inside one of masks.
func insideAny(masks []MaskedDir, path string) bool {
	for _, m := range masks {
		if strings.HasPrefix(path, m.Path+"/") {
			return true
		}
	}
	return false
}

// KeepVisible are the paths of a run that its masks must not hide: its
// workspace, berth-agent's binary, its policy's allow paths, the resolver's
// file (wherever /etc/resolv.conf points) and the directory of its egress
// socket ("" when it has none). KeepPaths picks those a mask would hide.
func KeepVisible(workspace, agentBinary string, policy agentproto.Policy, egressSocket string) []string {
	keep := []string{workspace, agentBinary}
	keep = append(keep, policy.AllowReadWrite...)
	keep = append(keep, policy.AllowRead...)
	keep = append(keep, "/etc/resolv.conf")
	if egressSocket != "" {
		keep = append(keep, filepath.Dir(egressSocket))
	}
	return keep
}

// KeepWritable are the paths of KeepVisible that stay writable when they are
// bound back: the workspace, the policy's read-write paths and the egress
// socket's directory. The rest is bound back read-only: the run's own /tmp
// is read-write to Landlock, and a read-only path bound into it (berth-agent
// itself, where a quickstart put it under /tmp) must not become writable
// with it.
func KeepWritable(workspace string, policy agentproto.Policy, egressSocket string) []string {
	keep := append([]string{workspace}, policy.AllowReadWrite...)
	if egressSocket != "" {
		keep = append(keep, filepath.Dir(egressSocket))
	}
	return keep
}

// KeepPaths are the paths of keep that a mask would hide (strictly inside a
// masked directory, after following links), cleaned and deduplicated:
// what MaskSocketDirs binds back. A path that is a masked directory or
// contains one does not lift its mask.
func KeepPaths(masks []MaskedDir, keep []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range keep {
		if !filepath.IsAbs(p) {
			continue
		}
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		p = filepath.Clean(p)
		if seen[p] {
			continue
		}
		for _, m := range masks {
			if strings.HasPrefix(p, m.Path+"/") {
				seen[p] = true
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// MaskSocketDirs masks masks (RunMasks) in the calling thread's mount
// namespace, which must be its own (unshared, or made with the process) and
// in which it holds CAP_SYS_ADMIN: it makes every mount private (nothing
// propagates back to the host), mounts an empty tmpfs on each masked
// directory and binds each of keep that a mask hides back to where it was,
// read-only unless it is or lies beneath one of writable (KeepWritable). It
// returns what it masked. It stops at the first failure, saying what
// failed; the caller must then not start the run.
func MaskSocketDirs(masks []MaskedDir, keep, writable []string) ([]string, error) {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("cannot make the run's mounts private: %w", err)
	}
	// The kept paths are opened before the masks hide them, and bound back
	// from those descriptors afterwards.
	type kept struct {
		path     string
		fd       int
		dir      bool
		readOnly bool
	}
	var keeps []kept
	defer func() {
		for _, k := range keeps {
			unix.Close(k.fd)
		}
	}()
	rw := KeepPaths(masks, writable)
	paths := KeepPaths(masks, keep)
	// Parents first: a path kept inside another kept one is bound on top
	// of it, not hidden under it.
	slices.SortStableFunc(paths, func(a, b string) int { return strings.Count(a, "/") - strings.Count(b, "/") })
	for _, p := range paths {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, fmt.Errorf("cannot keep %s visible: %w", p, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("cannot keep %s visible: %w", p, err)
		}
		readOnly := !slices.ContainsFunc(rw, func(w string) bool { return p == w || strings.HasPrefix(p, w+"/") })
		keeps = append(keeps, kept{path: p, fd: fd, dir: st.Mode&unix.S_IFMT == unix.S_IFDIR, readOnly: readOnly})
	}
	var done []string
	for _, m := range masks {
		if err := unix.Mount("tmpfs", m.Path, "tmpfs", m.mountFlags(), m.mountOptions()); err != nil {
			return done, fmt.Errorf("cannot mask %s: %w", m.Path, err)
		}
		done = append(done, m.Path)
	}
	for _, k := range keeps {
		if err := bindBack(k.path, k.fd, k.dir, k.readOnly); err != nil {
			return done, err
		}
	}
	return done, nil
}

// bindBack binds the file or directory open as fd onto path, creating the
// mount point (and its parents) in the tmpfs that hides it, and makes the
// bind read-only when readOnly says so.
func bindBack(path string, fd int, dir, readOnly bool) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("cannot keep %s visible: %w", path, err)
	}
	if dir {
		if err := os.Mkdir(path, 0o755); err != nil && !os.IsExist(err) {
			return fmt.Errorf("cannot keep %s visible: %w", path, err)
		}
	} else {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			return fmt.Errorf("cannot keep %s visible: %w", path, err)
		}
		f.Close()
	}
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", fd), path, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("cannot keep %s visible: %w", path, err)
	}
	if !readOnly {
		return nil
	}
	// A remount must repeat the flags the source's mount has: in a user
	// namespace they are locked, and leaving one out is refused (EPERM).
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return fmt.Errorf("cannot keep %s read-only: %w", path, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
	for st, ms := range map[int64]uintptr{
		unix.ST_NOSUID: unix.MS_NOSUID, unix.ST_NODEV: unix.MS_NODEV, unix.ST_NOEXEC: unix.MS_NOEXEC,
		unix.ST_NOATIME: unix.MS_NOATIME, unix.ST_NODIRATIME: unix.MS_NODIRATIME, unix.ST_RELATIME: unix.MS_RELATIME,
	} {
		if int64(fs.Flags)&st != 0 { // int32 on 32-bit architectures
			flags |= ms
		}
	}
	if err := unix.Mount("", path, "", flags, ""); err != nil {
		return fmt.Errorf("cannot keep %s read-only: %w", path, err)
	}
	return nil
}
