package confine

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// resolver resolves paths exactly as filepath.EvalSymlinks does (one lstat
// per component, a readlink per symlink), remembering each answer: the
// policy's paths share their prefixes (/usr, /etc, /proc, the state dir),
// and the agent's and the tools' plans share nearly every path, so each
// prefix costs one lstat per Enforce instead of one per path and plan. It
// is meant for one Enforce: what it remembers is the file system as it was
// when the plan was made, which is what the rulesets are built from anyway.
type resolver struct {
	lstats map[string]lstatResult
	links  map[string]linkResult
	dirs   map[string]dirResult
}

type lstatResult struct {
	mode fs.FileMode // file type bits only
	err  error
}

type linkResult struct {
	target string
	err    error
}

type dirResult struct {
	entries []fs.DirEntry
	err     error
}

func newResolver() *resolver {
	return &resolver{lstats: map[string]lstatResult{}, links: map[string]linkResult{}, dirs: map[string]dirResult{}}
}

// lstat is os.Lstat's file type (and its error), asked once per path.
func (r *resolver) lstat(path string) (fs.FileMode, error) {
	if res, ok := r.lstats[path]; ok {
		return res.mode, res.err
	}
	var st unix.Stat_t
	err := ignoringEINTR(func() error { return unix.Lstat(path, &st) })
	var res lstatResult
	if err != nil {
		res.err = &fs.PathError{Op: "lstat", Path: path, Err: err}
	} else {
		res.mode = fileType(st.Mode)
	}
	r.lstats[path] = res
	return res.mode, res.err
}

// stat is lstat for a path without symlinks in it: what place examines.
func (r *resolver) stat(path string) (fs.FileMode, error) {
	return r.lstat(filepath.Clean(path))
}

func (r *resolver) readlink(path string) (string, error) {
	if res, ok := r.links[path]; ok {
		return res.target, res.err
	}
	target, err := os.Readlink(path)
	r.links[path] = linkResult{target: target, err: err}
	return target, err
}

func (r *resolver) readDir(path string) ([]fs.DirEntry, error) {
	if res, ok := r.dirs[path]; ok {
		return res.entries, res.err
	}
	entries, err := os.ReadDir(path)
	r.dirs[path] = dirResult{entries: entries, err: err}
	return entries, err
}

func fileType(m uint32) fs.FileMode {
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		return fs.ModeDir
	case unix.S_IFLNK:
		return fs.ModeSymlink
	case unix.S_IFREG:
		return 0
	case unix.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		return fs.ModeDevice
	case unix.S_IFIFO:
		return fs.ModeNamedPipe
	case unix.S_IFSOCK:
		return fs.ModeSocket
	}
	return fs.ModeIrregular
}

func ignoringEINTR(fn func() error) error {
	for {
		err := fn()
		if err != unix.EINTR {
			return err
		}
	}
}

// evalSymlinks is filepath.EvalSymlinks for an absolute path (the walk of
// path/filepath's walkSymlinks, with its results and errors), through r's
// remembered lstats and readlinks.
func (r *resolver) evalSymlinks(path string) (string, error) {
	const sep = "/"
	volLen := 0
	if len(path) > 0 && path[0] == '/' {
		volLen = 1
	}
	vol := path[:volLen]
	dest := vol
	linksWalked := 0
	for start, end := volLen, volLen; start < len(path); start = end {
		for start < len(path) && path[start] == '/' {
			start++
		}
		end = start
		for end < len(path) && path[end] != '/' {
			end++
		}

		// The next path component is in path[start:end].
		if end == start {
			break // no more path components
		} else if path[start:end] == "." {
			continue
		} else if path[start:end] == ".." {
			// Back up to the previous component if possible.
			var i int
			for i = len(dest) - 1; i >= volLen; i-- {
				if dest[i] == '/' {
					break
				}
			}
			if i < volLen || dest[i+1:] == ".." {
				if len(dest) > 0 && dest[len(dest)-1] != '/' {
					dest += sep
				}
				dest += ".."
			} else {
				dest = dest[:i]
			}
			continue
		}

		if len(dest) > 0 && dest[len(dest)-1] != '/' {
			dest += sep
		}
		dest += path[start:end]

		mode, err := r.lstat(dest)
		if err != nil {
			return "", err
		}
		if mode&fs.ModeSymlink == 0 {
			if !mode.IsDir() && end < len(path) {
				return "", syscall.ENOTDIR
			}
			continue
		}

		linksWalked++
		if linksWalked > 255 {
			return "", errors.New("EvalSymlinks: too many links")
		}
		link, err := r.readlink(dest)
		if err != nil {
			return "", err
		}
		path = link + path[end:]
		if len(link) > 0 && link[0] == '/' {
			// Symlink to an absolute path.
			dest, end, vol, volLen = "/", 1, "/", 1
		} else {
			// Symlink to a relative path: replace the last component of dest.
			var i int
			for i = len(dest) - 1; i >= volLen; i-- {
				if dest[i] == '/' {
					break
				}
			}
			if i < volLen {
				dest = vol
			} else {
				dest = dest[:i]
			}
			end = 0
		}
	}
	return filepath.Clean(dest), nil
}
