package workspace

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

type mountEntry struct {
	point  string
	fstype string
	source string
}

// readMountinfo lists the mounts of the calling thread's namespace, in the
// order they were made.
func readMountinfo() ([]mountEntry, error) {
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cannot read mounts: %w", err)
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || len(fields) < sep+3 {
			continue
		}
		out = append(out, mountEntry{point: unescape(fields[4]), fstype: fields[sep+1], source: unescape(fields[sep+2])})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cannot read mounts: %w", err)
	}
	return out, nil
}

// unescape undoes mountinfo's octal escapes (\040 is a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

type state int

const (
	notMounted state = iota
	mounted
	mountedOther
)

// mountState says what the topmost mount at dir is: the image, something
// else, or nothing of its own.
func mountState(dir, image string) (state, error) {
	mounts, err := readMountinfo()
	if err != nil {
		return notMounted, err
	}
	dir, image = resolved(dir), resolved(image)
	for i := len(mounts) - 1; i >= 0; i-- {
		if mounts[i].point != dir {
			continue
		}
		if backingFile(mounts[i].source) == image {
			return mounted, nil
		}
		return mountedOther, nil
	}
	return notMounted, nil
}

// mountedElsewhere is where else than dir the image is mounted, or "".
func mountedElsewhere(image, dir string) string {
	mounts, err := readMountinfo()
	if err != nil {
		return ""
	}
	dir, image = resolved(dir), resolved(image)
	for _, m := range mounts {
		if m.point != dir && backingFile(m.source) == image {
			return m.point
		}
	}
	return ""
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
