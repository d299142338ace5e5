package workspace

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Every run of an agent with a quota calls Ensure, and nearly always its
// image is mounted at its workspace already, at the right size. Reading
// and parsing the mount table for that cost more than the rest of a run's
// preparation, so Ensure remembers what it mounted or found (a mountRecord)
// and confirms it with two stats and one read instead. Whatever does not
// match, the record is dropped and Ensure does its full work, mount table
// and sweep of deleted images included.

// A mountRecord is what was mounted where, as the kernel names it.
type mountRecord struct {
	dir     string // the workspace, as Options.Dir
	bytes   int64  // the quota the image has
	dev     uint64 // st_dev of the workspace's root: the loop device
	rootIno uint64 // st_ino of the workspace's root: the image's root directory
	imgDev  uint64 // the image file itself
	imgIno  uint64
	// backing is the loop device's backing file (the image, resolved), and
	// backingFD the sysfs file that said so, kept open: the kernel removes
	// that file when the device is detached, so a read through the fd fails
	// from then on, even once the device is attached again (to this image
	// or to any other).
	backing   string
	backingFD int
}

// records holds the *mountRecord of each image (path → record). An entry
// is read, replaced and dropped only by the holder of lockImage(image).
var records sync.Map

// stillMounted says whether the workspace's image is still the one
// mounted there, at o.Bytes, as recorded: the workspace's root is the root
// directory of the recorded loop device, that device has stayed attached
// to the image since (not detached, and another file attached, which can
// get the same device number), and the image is the same file of the same
// size. Run on a thread of the start namespace, under the image's lock.
func stillMounted(o Options) bool {
	v, ok := records.Load(o.Image)
	if !ok {
		return false
	}
	rec := v.(*mountRecord)
	if rec.dir != o.Dir || rec.bytes != o.Bytes {
		return false
	}
	var img, root unix.Stat_t
	if unix.Stat(o.Image, &img) != nil || img.Dev != rec.imgDev || img.Ino != rec.imgIno || img.Size != o.Bytes || img.Mode&unix.S_IFMT != unix.S_IFREG {
		return false
	}
	if unix.Stat(o.Dir, &root) != nil || root.Dev != rec.dev || root.Ino != rec.rootIno {
		return false
	}
	backing, ok := readBacking(rec.backingFD)
	return ok && backing == rec.backing
}

// remember records the image o.Image as mounted at o.Dir, once Ensure has
// found it so in the mount table. Nothing is recorded when it does not
// look like the image at its full size (a resize left for a later run):
// the next Ensure then does its full work again. Under the image's lock.
func remember(o Options) {
	drop(o.Image)
	var img, root unix.Stat_t
	if unix.Stat(o.Image, &img) != nil || img.Size != o.Bytes || img.Mode&unix.S_IFMT != unix.S_IFREG {
		return
	}
	if unix.Stat(o.Dir, &root) != nil {
		return
	}
	path := fmt.Sprintf("/sys/dev/block/%d:%d/loop/backing_file", unix.Major(root.Dev), unix.Minor(root.Dev))
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return // not a loop device
	}
	backing, ok := readBacking(fd)
	if !ok || backing != resolved(o.Image) {
		unix.Close(fd)
		return
	}
	records.Store(o.Image, &mountRecord{
		dir: o.Dir, bytes: o.Bytes, dev: root.Dev, rootIno: root.Ino,
		imgDev: img.Dev, imgIno: img.Ino, backing: backing, backingFD: fd,
	})
}

// drop forgets the record of image. Under the image's lock.
func drop(image string) {
	if v, ok := records.LoadAndDelete(image); ok {
		unix.Close(v.(*mountRecord).backingFD)
	}
}

// forget drops the records of the images under imageDir (Release has
// unmounted them).
func forget(imageDir string) {
	records.Range(func(k, _ any) bool {
		if img := k.(string); strings.HasPrefix(img, imageDir+"/") {
			if release, err := lockImage(context.Background(), img); err == nil {
				drop(img)
				release()
			}
		}
		return true
	})
}

// readBacking reads a loop device's backing_file through fd: one system
// call, on every run's path.
func readBacking(fd int) (string, bool) {
	var buf [unix.PathMax + 16]byte
	n, err := unix.Pread(fd, buf[:], 0)
	if err != nil || n <= 0 || n == len(buf) {
		return "", false
	}
	return strings.TrimSpace(string(buf[:n])), true
}
