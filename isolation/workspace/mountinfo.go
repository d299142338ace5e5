package workspace

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/berth-dev/berth/internal/mountinfo"
)

// readMountinfo lists the mounts of the calling thread's namespace, in the
// order they were made.
func readMountinfo() ([]mountinfo.Mount, error) { return mountinfo.Read(mountinfo.Self) }

type state int

const (
	notMounted state = iota
	mounted
	mountedOther
)

// mountState says what the topmost mount at dir is: the image, something
// else, or nothing of its own; elsewhere is a mount point of the image
// other than dir, "" when there is none.
func mountState(dir, image string) (st state, elsewhere string, err error) {
	mounts, err := readMountinfo()
	if err != nil {
		return notMounted, "", err
	}
	dir, image = resolved(dir), resolved(image)
	for _, m := range mounts {
		isImage := backingFile(m.Source) == image
		switch {
		case m.Point == dir && isImage:
			st = mounted
		case m.Point == dir:
			st = mountedOther
		case isImage && elsewhere == "":
			elsewhere = m.Point
		}
	}
	return st, elsewhere, nil
}

// backingFile is the file behind a loop device (/dev/loopN), or "".
func backingFile(source string) string {
	name, ok := strings.CutPrefix(source, "/dev/")
	if !ok || !strings.HasPrefix(name, "loop") {
		return ""
	}
	b, err := os.ReadFile(filepath.Join("/sys/block", name, "loop", "backing_file"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// loopsOf lists the loop devices attached to image.
func loopsOf(image string) []string {
	image = resolved(image)
	paths, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(b)) == image {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(p))))
		}
	}
	return out
}

func resolved(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return filepath.Clean(p)
}
