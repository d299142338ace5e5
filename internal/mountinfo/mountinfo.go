// Package mountinfo reads the mount table of the calling thread's mount
// namespace (proc(5), /proc/thread-self/mountinfo). The cgroup probe and the
// workspace images both need it; the thread matters because a locked
// thread may have entered a run's own mount namespace.
package mountinfo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Self is the mount table of the calling thread.
const Self = "/proc/thread-self/mountinfo"

// Mount is one line of a mountinfo file.
type Mount struct {
	Root   string   // field 4: the root of the mount within its filesystem
	Point  string   // field 5: the mount point
	FSType string   // after the "-": the filesystem type
	Source string   // the mount source (a device, or "none")
	Super  []string // the super options (for cgroup v1: its controllers)
}

// Read lists the mounts in the mountinfo file at path, in the order they
// were made.
func Read(path string) ([]Mount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read mounts: %w", err)
	}
	defer f.Close()
	out, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("cannot read mounts from %s: %w", path, err)
	}
	return out, nil
}

// Parse reads mountinfo lines:
//
//	36 35 98:0 /root /mount/point rw,relatime shared:1 - fstype source superopts
//
// The optional fields before "-" vary in number; lines it cannot read are
// skipped.
func Parse(r io.Reader) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f1, f2 := strings.Fields(pre), strings.Fields(post)
		if len(f1) < 5 || len(f2) < 2 {
			continue
		}
		m := Mount{Root: Unescape(f1[3]), Point: Unescape(f1[4]), FSType: f2[0], Source: Unescape(f2[1])}
		if len(f2) > 2 {
			m.Super = strings.Split(f2[2], ",")
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// Unescape undoes mountinfo's octal escapes (\040 is a space).
func Unescape(s string) string {
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
