// Package filestamp tells a file's versions apart without reading it: what
// stat(2) reports (device, inode, size, mtime and ctime) changes when the
// file is rewritten, replaced or renamed over, so a cache keyed by a Stamp
// sees the new file at its next look.
package filestamp

import (
	"fmt"
	"syscall"
)

// Stamp is one version of a file as stat(2) sees it. The zero Stamp is what
// a caller uses for "no file".
type Stamp struct {
	Dev, Ino     uint64
	Size         int64
	Mtime, Ctime syscall.Timespec
}

// Of returns the stamp of the file at path (symbolic links followed).
func Of(path string) (Stamp, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return Stamp{}, fmt.Errorf("cannot stat %s: %w", path, err)
	}
	return Stamp{Dev: st.Dev, Ino: st.Ino, Size: st.Size, Mtime: st.Mtim, Ctime: st.Ctim}, nil
}
