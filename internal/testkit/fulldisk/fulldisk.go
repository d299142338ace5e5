// Package fulldisk gives tests a real filesystem that fills up: a small
// tmpfs mounted in a test's temporary directory (root only), and a filler
// file that takes every free byte until the test removes it.
package fulldisk

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// Mount mounts a tmpfs of size bytes on a fresh directory and returns it;
// it is unmounted when the test ends. The test needs root.
func Mount(t testing.TB, size int64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "disk")
	MountAt(t, dir, size)
	return dir
}

// MountAt mounts a tmpfs of size bytes on dir (created when missing), to
// be unmounted when the test ends: a daemon's state directory, say. The
// test needs root.
func MountAt(t testing.TB, dir string, size int64) {
	t.Helper()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("mount")
	testenv.Need(t, err == nil, "mount(8) is not installed")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0755", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("cannot mount a tmpfs on %s: %v: %s", dir, err, out)
	}
	t.Cleanup(func() {
		// Lazy: a daemon of the test may still hold a file open.
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("cannot unmount %s: %v: %s", dir, err, out)
		}
	})
}

// Filler is a file that takes up the free space of its filesystem.
type Filler struct {
	path string
}

// Fill writes a file in dir until the filesystem refuses with ENOSPC, so
// that the next write that needs a new block fails. Free removes it.
func Fill(t testing.TB, dir string) *Filler {
	t.Helper()
	f, err := os.CreateTemp(dir, "filler-*")
	if err != nil {
		t.Fatalf("cannot create filler: %v", err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for len(chunk) > 0 {
		_, err := f.Write(chunk)
		if errors.Is(err, syscall.ENOSPC) {
			chunk = chunk[:len(chunk)/2] // fill the last partial blocks too
			continue
		}
		if err != nil {
			t.Fatalf("cannot fill %s: %v", dir, err)
		}
	}
	return &Filler{path: f.Name()}
}

// Free removes the filler: space returns.
func (f *Filler) Free(t testing.TB) {
	t.Helper()
	if err := os.Remove(f.path); err != nil {
		t.Fatalf("cannot remove filler: %v", err)
	}
}
