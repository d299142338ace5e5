package isolation

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/berth-dev/berth/internal/agentproto"
)

// SystemReadOnly is what every confined host run may read so that /bin/sh and
// common tools start: binaries and libraries, the dynamic loader's cache, name
// service and resolver files, time zones, TLS roots and the agent's own /proc
// entry. It deliberately does not hold /etc as a whole: /etc/shadow, ssh host
// keys and berth's own config stay unreadable. Paths missing on this host are
// left out of the policy (berth-agent treats a missing policy path as an error).
//
// /proc/self resolves to berth-agent's own /proc/<pid> when it restricts
// itself; tools it starts have other pids and cannot read their /proc entry.
// That is the price of not exposing every host process's command line.
var SystemReadOnly = []string{
	"/usr",
	"/bin",
	"/sbin",
	"/lib",
	"/lib32",
	"/lib64",
	"/libx32",
	"/etc/ld.so.cache",
	"/etc/ld.so.conf",
	"/etc/ld.so.conf.d",
	"/etc/localtime",
	"/etc/timezone",
	"/etc/passwd",
	"/etc/group",
	"/etc/nsswitch.conf",
	"/etc/host.conf",
	"/etc/gai.conf",
	"/etc/hosts",
	"/etc/resolv.conf",
	"/etc/services",
	"/etc/protocols",
	"/etc/ssl/certs",
	"/usr/share/zoneinfo",
	"/proc/self",
	"/proc/cpuinfo",
	"/proc/meminfo",
}

// SystemReadWrite are the device files every process expects to open for
// writing. They are files, not directories: nothing else under /dev is granted.
var SystemReadWrite = []string{
	"/dev/null",
	"/dev/zero",
	"/dev/full",
	"/dev/random",
	"/dev/urandom",
}

// PolicyOption adjusts HostPolicy.
type PolicyOption func(*policyOptions)

type policyOptions struct {
	runUserHome string
}

// RunUserHome names the home directory of the user the agent runs as. With
// file_access.allow_home_dotfiles it grants read access to the dot entries
// found there (files and directories, e.g. .gitconfig, .config). Without this
// option allow_home_dotfiles grants nothing.
func RunUserHome(dir string) PolicyOption {
	return func(o *policyOptions) { o.runUserHome = dir }
}

// FileAccess is what an agent's file_access asks for.
type FileAccess struct {
	Unrestricted      bool
	AllowRead         []string
	AllowReadWrite    []string
	Deny              []string
	AllowHomeDotfiles bool
	AllowNetwork      bool
}

// HostPolicy computes the complete Landlock policy berth-agent applies to
// itself on the host: the workspace read-write, the system set
// (SystemReadOnly, SystemReadWrite), the agent's file_access paths, and a Deny
// list made of file_access.deny plus protect (berth's config dir, state dir,
// other agents' workspaces).
//
// The workspace always stays usable: a Deny path that is the workspace is
// dropped, and one that contains the workspace (the state dir, the agents
// root) is replaced by its entries that do not lead to the workspace, level by
// level. That expansion lists directories now, so the policy must be computed
// for each run (files created later under a denied ancestor are not listed;
// they are still unreachable unless an allow path covers them).
//
// When file_access.unrestricted is set the policy is only Unrestricted plus the
// network switch.
func HostPolicy(fa FileAccess, workspace string, protect []string, opts ...PolicyOption) agentproto.Policy {
	var o policyOptions
	for _, opt := range opts {
		opt(&o)
	}
	if fa.Unrestricted {
		return agentproto.Policy{Unrestricted: true, Network: fa.AllowNetwork}
	}
	workspace = filepath.Clean(workspace)

	var readOnly []string
	for _, p := range SystemReadOnly {
		if exists(p) {
			readOnly = append(readOnly, p)
		}
	}
	if fa.AllowHomeDotfiles && o.runUserHome != "" {
		readOnly = append(readOnly, dotfiles(o.runUserHome, workspace)...)
	}
	readOnly = append(readOnly, fa.AllowRead...)

	readWrite := []string{workspace}
	for _, p := range SystemReadWrite {
		if exists(p) {
			readWrite = append(readWrite, p)
		}
	}
	readWrite = append(readWrite, fa.AllowReadWrite...)

	var deny []string
	res := newResolver()
	keep := res.resolved(workspace)
	for _, d := range append(append([]string(nil), fa.Deny...), protect...) {
		deny = append(deny, res.carveOut(d, keep)...)
	}

	return agentproto.Policy{
		AllowRead:      cleanUnique(readOnly),
		AllowReadWrite: cleanUnique(readWrite),
		Deny:           cleanUnique(deny),
		Network:        fa.AllowNetwork,
	}
}

// carveOut returns what to deny for deny so that keep (resolved already)
// stays reachable: deny itself when it is unrelated to keep or inside it,
// nothing when it is keep, and the entries of deny that do not lead to keep
// when deny contains keep.
func (res *resolver) carveOut(deny, keep string) []string {
	if deny == "" {
		return nil
	}
	deny = filepath.Clean(deny)
	d, k := res.resolved(deny), keep
	if d == k {
		return nil
	}
	rel, err := filepath.Rel(d, k)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return []string{deny}
	}
	// d is an ancestor of k: deny every entry on the way down except the one
	// leading to k.
	var out []string
	dir := d
	for _, next := range strings.Split(rel, string(filepath.Separator)) {
		for _, name := range readDirNames(dir) {
			if name != next {
				out = append(out, filepath.Join(dir, name))
			}
		}
		dir = filepath.Join(dir, next)
	}
	return out
}

// readDirNames lists dir's entries in order, as os.ReadDir would, with
// bare system calls (a run's policy lists the state dir and the agents'
// directory); nil when dir cannot be read.
func readDirNames(dir string) []string {
	var fd int
	err := retryEINTR(func() (err error) {
		fd, err = syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil
	}
	defer syscall.Close(fd)
	var names []string
	buf := make([]byte, 8192)
	for {
		var n int
		if err := retryEINTR(func() (err error) { n, err = syscall.ReadDirent(fd, buf); return err }); err != nil {
			return nil
		}
		if n <= 0 {
			break
		}
		_, _, names = syscall.ParseDirent(buf[:n], -1, names)
	}
	slices.Sort(names)
	return names
}

// A resolver follows symlinks so that ancestry is judged on the real tree,
// the one Landlock enforces on, as filepath.EvalSymlinks does; a path that
// does not resolve is taken as written. The deny list of a run is mostly
// siblings (the other agents' workspaces), so it remembers the resolution
// of each directory it has walked: every path costs one lstat of its last
// component instead of one per component. It lives for one HostPolicy
// call: the policy is computed for each run, on the tree as it is then.
type resolver struct {
	dirs map[string]string // absolute clean path → resolved; "" does not resolve
}

func newResolver() *resolver { return &resolver{dirs: map[string]string{}} }

func (r *resolver) resolved(p string) string {
	if real := r.resolve(filepath.Clean(p)); real != "" {
		return real
	}
	return filepath.Clean(p)
}

// resolve is EvalSymlinks(p) for a clean path, "" when it fails. For an
// absolute path without ".." (what Clean makes of one) the resolution of
// p is that of its parent with p's last name looked up there: a symlink
// found there is handed to EvalSymlinks whole (its target may hold "..",
// which must apply after the links before it are followed).
func (r *resolver) resolve(p string) string {
	if !filepath.IsAbs(p) {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return ""
		}
		return real
	}
	if p == "/" {
		return p
	}
	if real, ok := r.dirs[p]; ok {
		return real
	}
	real := ""
	if parent := r.resolve(filepath.Dir(p)); parent != "" {
		candidate := filepath.Join(parent, filepath.Base(p))
		var st syscall.Stat_t
		switch err := retryEINTR(func() error { return syscall.Lstat(candidate, &st) }); {
		case err != nil:
		case st.Mode&syscall.S_IFMT != syscall.S_IFLNK:
			real = candidate
		default:
			if target, err := filepath.EvalSymlinks(candidate); err == nil {
				real = target
			}
		}
	}
	r.dirs[p] = real
	return real
}

// dotfiles lists the dot entries of home, leaving out the workspace (which is
// read-write already) in case the workspace lives in home.
func dotfiles(home, workspace string) []string {
	entries, err := os.ReadDir(home)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(home, e.Name())
		if p == workspace || strings.HasPrefix(workspace, p+"/") {
			continue
		}
		out = append(out, p)
	}
	return out
}

// exists says whether p (followed) exists; it is asked for every system
// path of every run, so it spares os.Stat's allocations.
func exists(p string) bool {
	var st syscall.Stat_t
	return retryEINTR(func() error { return syscall.Stat(p, &st) }) == nil
}

func retryEINTR(f func() error) error {
	for {
		if err := f(); err != syscall.EINTR {
			return err
		}
	}
}

func cleanUnique(paths []string) []string {
	seen := make(map[string]bool, len(paths))
	var out []string
	for _, p := range paths {
		if p == "" {
			continue
		}
		p = filepath.Clean(p)
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// ContainerPolicy is the Landlock policy berth-agent applies to itself inside
// a container, on top of the container's own walls: the workspace and /tmp
// read-write, the system set read-only (paths missing from the image are
// skipped by the agent), and TCP only when the container has a network.
// file_access paths are host paths and mean nothing inside a container.
func ContainerPolicy(network bool) agentproto.Policy {
	readWrite := append([]string{ContainerWorkspace, ContainerTmp}, SystemReadWrite...)
	return agentproto.Policy{
		AllowRead:      append([]string(nil), SystemReadOnly...),
		AllowReadWrite: readWrite,
		Network:        network,
	}
}
