package confine

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strings"
	"syscall"
)

// Access is what a planned rule grants beneath its path.
type Access int

const (
	// Read allows reading files, listing directories and executing files.
	Read Access = iota
	// ReadWrite allows everything the kernel's Landlock ABI can restrict.
	ReadWrite
)

func (a Access) String() string {
	if a == ReadWrite {
		return "read-write"
	}
	return "read"
}

// Rule is one Landlock path rule: Access granted on Path and everything beneath it.
type Rule struct {
	Path   string // absolute, symlinks resolved
	Dir    bool   // false for regular files, devices, sockets: they get file rights only
	Access Access
}

// Plan turns the policy's path lists into Landlock rules. Landlock can only
// allow, so a denied path is carved out of an allowed directory by allowing
// each of the directory's entries except the one leading to the denied path,
// recursively down to it. An allowed path inside a denied one is dropped;
// allowed paths that do not exist are skipped, denied ones are carved out
// all the same (so they stay denied if they appear during the run), and a
// denied path in a directory the agent may not search denies that directory
// (resolveMissing). Symlinks are resolved first, so a rule lands on the
// inode Landlock will check.
//
// Plan fails when a path is not absolute or cannot be examined: a policy it
// cannot read is a policy it cannot enforce.
func Plan(allowRead, allowReadWrite, deny []string, log *slog.Logger) ([]Rule, error) {
	return newResolver().plan(allowRead, allowReadWrite, deny, log)
}

// plan is Plan with what r already learnt about the file system: the
// agent's and the tools' policies share nearly all their paths.
func (r *resolver) plan(allowRead, allowReadWrite, deny []string, log *slog.Logger) ([]Rule, error) {
	p := planner{log: log, seen: map[Rule]bool{}, fs: r}
	for _, d := range deny {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("cannot plan confinement: deny path %q is not absolute", d)
		}
		resolved, err := r.resolveMissing(d)
		if err != nil {
			return nil, fmt.Errorf("cannot resolve denied path: %w", err)
		}
		p.deny = append(p.deny, resolved)
	}
	for _, list := range []struct {
		paths  []string
		access Access
	}{{allowReadWrite, ReadWrite}, {allowRead, Read}} {
		for _, path := range list.paths {
			if !filepath.IsAbs(path) {
				return nil, fmt.Errorf("cannot plan confinement: %s path %q is not absolute", list.access, path)
			}
			if err := p.add(path, list.access); err != nil {
				return nil, err
			}
		}
	}
	return p.rules, nil
}

type planner struct {
	log   *slog.Logger
	fs    *resolver
	deny  []string
	rules []Rule
	seen  map[Rule]bool
}

// add resolves path and places a rule for it.
func (p *planner) add(path string, access Access) error {
	resolved, err := p.fs.evalSymlinks(path)
	if errors.Is(err, fs.ErrNotExist) {
		p.log.Debug("allowed path does not exist; skipped", "path", path, "access", access.String())
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot resolve allowed path: %w", err)
	}
	return p.place(resolved, access)
}

// place adds a rule for the resolved path, splitting directories that contain
// a denied path.
func (p *planner) place(path string, access Access) error {
	key := Rule{Path: path, Access: access}
	if p.seen[key] {
		return nil
	}
	p.seen[key] = true

	if d, ok := p.deniedBy(path); ok {
		p.log.Debug("allowed path lies inside a denied one; dropped", "path", path, "deny", d)
		return nil
	}
	// path has no symlink in it (resolved, or an entry that is no symlink),
	// so its lstat is its stat.
	mode, err := p.fs.stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		p.log.Debug("allowed path does not exist; skipped", "path", path)
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot examine allowed path: %w", err)
	}
	if !mode.IsDir() {
		p.rules = append(p.rules, Rule{Path: path, Access: access})
		return nil
	}
	if !p.containsDenied(path) {
		p.rules = append(p.rules, Rule{Path: path, Dir: true, Access: access})
		return nil
	}
	entries, err := p.fs.readDir(path)
	if err != nil {
		return fmt.Errorf("cannot split allowed directory around a denied path: %w", err)
	}
	for _, e := range entries {
		// A symlink entry needs no rule: following it lands on its target,
		// which the target's own hierarchy governs. Resolving it here would
		// grant a target the unsplit directory never covered.
		if e.Type()&fs.ModeSymlink != 0 {
			continue
		}
		if err := p.place(filepath.Join(path, e.Name()), access); err != nil {
			return err
		}
	}
	return nil
}

// deniedBy reports the denied path that path equals or lies beneath.
func (p *planner) deniedBy(path string) (string, bool) {
	for _, d := range p.deny {
		if path == d || isBeneath(path, d) {
			return d, true
		}
	}
	return "", false
}

// containsDenied reports whether a denied path lies strictly beneath dir.
func (p *planner) containsDenied(dir string) bool {
	for _, d := range p.deny {
		if isBeneath(d, dir) {
			return true
		}
	}
	return false
}

// resolveMissing resolves symlinks in a denied path; for a path that does
// not exist (yet) it resolves the nearest existing ancestor and keeps the
// rest. A denied path that is created during the run must stay denied:
// splitting the allowed directory around it grants only the entries that
// exist now. A path beneath a file (ENOTDIR) cannot exist and is treated the
// same way.
//
// A path the agent cannot reach because a directory on the way may not be
// searched (EACCES: a root-only credentials directory) is denied by that
// directory as a whole: nothing beneath it can be opened by the agent, and
// the split around it then never needs to list it, which it could not.
// Only denied paths are resolved this way; an allowed path that cannot be
// resolved fails the plan.
func (r *resolver) resolveMissing(path string) (string, error) {
	resolved, err := r.evalSymlinks(path)
	if err == nil {
		return resolved, nil
	}
	if errors.Is(err, syscall.EACCES) {
		var pathErr *fs.PathError
		if errors.As(err, &pathErr) && filepath.IsAbs(pathErr.Path) && pathErr.Path != "/" {
			return filepath.Dir(pathErr.Path), nil
		}
		return "", err
	}
	if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
		return "", err
	}
	parent := filepath.Dir(path)
	if parent == path {
		return path, nil
	}
	base, err := r.resolveMissing(parent)
	if err != nil {
		return "", err
	}
	return filepath.Join(base, filepath.Base(path)), nil
}

// isBeneath reports whether path lies strictly beneath dir (both clean and absolute).
func isBeneath(path, dir string) bool {
	if dir == "/" {
		return path != "/"
	}
	return strings.HasPrefix(path, dir+"/")
}
