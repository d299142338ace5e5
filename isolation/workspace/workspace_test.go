package workspace_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/mountinfo"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation/workspace"
)

const mib = 1 << 20

// setup is a workspace and an image path in a fresh directory; what Ensure
// mounts there is unmounted when the test ends.
func setup(t testing.TB) workspace.Options {
	t.Helper()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		_, err = os.Stat("/usr/sbin/mkfs.ext4")
	}
	testenv.Need(t, err == nil, "mkfs.ext4 (e2fsprogs) is not installed")
	testenv.Need(t, fileExists("/dev/loop-control"), "no loop devices")
	root := t.TempDir()
	images := filepath.Join(root, "workspaces")
	t.Cleanup(func() {
		if err := workspace.Release(images); err != nil {
			t.Errorf("Release: %v", err)
		}
	})
	return workspace.Options{
		Dir:   filepath.Join(root, "agents", "alpha"),
		Image: filepath.Join(images, "alpha.img"),
		Bytes: 32 * mib,
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func ensure(t *testing.T, o workspace.Options) {
	t.Helper()
	start := time.Now()
	if err := workspace.Ensure(context.Background(), o); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	t.Logf("Ensure took %v", time.Since(start))
}

func statfs(t *testing.T, dir string) unix.Statfs_t {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// mountsAt counts the mounts at dir.
func mountsAt(t *testing.T, dir string) int {
	t.Helper()
	mounts, err := mountinfo.Read(mountinfo.Self)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range mounts {
		if m.Point == dir {
			n++
		}
	}
	return n
}

func TestWorkspaceWritesStopAtTheQuota(t *testing.T) {
	t.Parallel()
	o := setup(t)
	ensure(t, o)
	if st := statfs(t, o.Dir); st.Type != unix.EXT4_SUPER_MAGIC {
		t.Fatalf("workspace is on filesystem type %#x, not ext4", st.Type)
	}
	if fi, err := os.Stat(o.Image); err != nil || fi.Size() != o.Bytes {
		t.Fatalf("image %v size %v; want %d", err, fi, o.Bytes)
	}
	f, err := os.Create(filepath.Join(o.Dir, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, mib)
	var written int64
	for written < 64*mib {
		n, err := f.Write(chunk)
		written += int64(n)
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("write failed with %v; want ENOSPC", err)
			}
			break
		}
	}
	if written >= 32*mib || written < 24*mib {
		t.Fatalf("wrote %d MiB into a 32 MiB workspace", written/mib)
	}
	if entries, _ := os.ReadDir(o.Dir); len(entries) != 1 {
		t.Fatalf("workspace holds %v; want only the file written (no lost+found)", entries)
	}
}

func TestWorkspaceEnsureTwiceIsANoOp(t *testing.T) {
	t.Parallel()
	o := setup(t)
	ensure(t, o)
	if err := os.WriteFile(filepath.Join(o.Dir, "kept"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	ensure(t, o)
	if n := mountsAt(t, o.Dir); n != 1 {
		t.Fatalf("%d mounts at the workspace; want 1", n)
	}
	if _, err := os.Stat(filepath.Join(o.Dir, "kept")); err != nil {
		t.Fatalf("file written before the second Ensure: %v", err)
	}
}

func TestWorkspaceExistingFilesMoveIntoTheImage(t *testing.T) {
	t.Parallel()
	o := setup(t)
	if err := os.MkdirAll(filepath.Join(o.Dir, "notes"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(o.Dir, "notes", "todo.md"), []byte("ship it"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("notes/todo.md", filepath.Join(o.Dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(o.Dir, "notes", "todo.md"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(o.Dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	ensure(t, o)
	if mountsAt(t, o.Dir) != 1 {
		t.Fatal("workspace is not mounted")
	}
	got, err := os.ReadFile(filepath.Join(o.Dir, "link"))
	if err != nil || string(got) != "ship it" {
		t.Fatalf("moved file through its link = %q, %v", got, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(o.Dir, "notes", "todo.md"), &st); err != nil || st.Uid != 65534 || st.Mode&0o777 != 0o600 {
		t.Fatalf("moved file owner %d mode %o (%v); want 65534 0600", st.Uid, st.Mode&0o777, err)
	}
	if err := unix.Stat(o.Dir, &st); err != nil || st.Uid != 65534 || st.Mode&0o777 != 0o700 {
		t.Fatalf("workspace root owner %d mode %o (%v); want 65534 0700", st.Uid, st.Mode&0o777, err)
	}
	// Nothing is left under the mount, on the host's disk.
	unmount(t, o.Dir)
	if entries, _ := os.ReadDir(o.Dir); len(entries) != 0 {
		t.Fatalf("the host's workspace directory still holds %v", entries)
	}
	ensure(t, o)
	if got, err := os.ReadFile(filepath.Join(o.Dir, "notes", "todo.md")); err != nil || string(got) != "ship it" {
		t.Fatalf("after a remount = %q, %v", got, err)
	}
}

func TestWorkspaceLargerQuotaGrowsTheFilesystem(t *testing.T) {
	t.Parallel()
	o := setup(t)
	ensure(t, o)
	if err := os.WriteFile(filepath.Join(o.Dir, "kept"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	before := statfs(t, o.Dir)
	o.Bytes = 64 * mib
	ensure(t, o)
	after := statfs(t, o.Dir)
	if got, was := int64(after.Blocks)*after.Bsize, int64(before.Blocks)*before.Bsize; got < 48*mib || got <= was {
		t.Fatalf("filesystem is %d MiB after growing from %d MiB to a 64 MiB quota", got/mib, was/mib)
	}
	if _, err := os.Stat(filepath.Join(o.Dir, "kept")); err != nil {
		t.Fatalf("file written before growing: %v", err)
	}
	if n := mountsAt(t, o.Dir); n != 1 {
		t.Fatalf("%d mounts at the workspace; want 1", n)
	}
}

func TestWorkspaceQuotaChanges(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		holds   int64
		quota   int64
		wantErr string
	}{
		{"Shrinking_below_what_is_stored_is_refused", 24 * mib, 16 * mib, "cannot shrink the workspace from 32m to 16m"},
		{"Shrinking_above_what_is_stored_works", 1 * mib, 16 * mib, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := setup(t)
			ensure(t, o)
			if err := os.WriteFile(filepath.Join(o.Dir, "data"), make([]byte, tc.holds), 0o600); err != nil {
				t.Fatal(err)
			}
			o.Bytes = tc.quota
			err := workspace.Ensure(context.Background(), o)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Ensure = %v; want an error containing %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatalf("Ensure: %v", err)
			}
			fi, _ := os.Stat(o.Image)
			if want := map[bool]int64{true: 32 * mib, false: tc.quota}[tc.wantErr != ""]; fi.Size() != want {
				t.Fatalf("image is %d MiB; want %d", fi.Size()/mib, want/mib)
			}
			if got, err := os.ReadFile(filepath.Join(o.Dir, "data")); err != nil || int64(len(got)) != tc.holds {
				t.Fatalf("stored file is %d bytes (%v) after the change; want %d", len(got), err, tc.holds)
			}
		})
	}
}

func TestWorkspaceRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		prepare func(t *testing.T, o *workspace.Options)
		wantErr string
	}{
		{"Quota_0_mounts_nothing", func(t *testing.T, o *workspace.Options) { o.Bytes = 0 }, ""},
		{"Another_filesystem_at_the_workspace_is_refused", func(t *testing.T, o *workspace.Options) {
			os.MkdirAll(o.Dir, 0o700)
			if err := unix.Mount("tmpfs", o.Dir, "tmpfs", 0, "size=1m"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unmount(t, o.Dir) })
		}, "another filesystem is mounted"},
		{"A_workspace_larger_than_its_quota_is_refused", func(t *testing.T, o *workspace.Options) {
			os.MkdirAll(o.Dir, 0o700)
			if err := os.WriteFile(filepath.Join(o.Dir, "big"), make([]byte, 40*mib), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "raise workspace_quota"},
		{"Files_next_to_an_existing_image_are_not_mixed", func(t *testing.T, o *workspace.Options) {
			if err := workspace.Ensure(context.Background(), *o); err != nil {
				t.Fatal(err)
			}
			unmount(t, o.Dir)
			os.WriteFile(filepath.Join(o.Dir, "stray"), nil, 0o600)
		}, "move one of them away"},
		{"An_image_mounted_at_another_workspace_is_not_mounted_twice", func(t *testing.T, o *workspace.Options) {
			other := *o
			other.Dir = o.Dir + "-other"
			if err := workspace.Ensure(context.Background(), other); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unmount(t, other.Dir) })
		}, "is already mounted at"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := setup(t)
			tc.prepare(t, &o)
			err := workspace.Ensure(context.Background(), o)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Ensure: %v", err)
				}
				if mountsAt(t, o.Dir) != 0 || fileExists(o.Image) {
					t.Fatal("a quota of 0 made or mounted an image")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "workspace_quota") {
				t.Fatalf("Ensure = %v; want an error naming workspace_quota and %q", err, tc.wantErr)
			}
		})
	}
}

func TestWorkspaceAMoveInterruptedAfterTheImageWasMadeFinishes(t *testing.T) {
	t.Parallel()
	o := setup(t)
	os.MkdirAll(o.Dir, 0o700)
	if err := os.WriteFile(filepath.Join(o.Dir, "notes"), []byte("in the image"), 0o600); err != nil {
		t.Fatal(err)
	}
	ensure(t, o)
	unmount(t, o.Dir)
	// The crash: the image is in place, the originals not yet removed.
	if err := os.WriteFile(filepath.Join(o.Dir, "notes"), []byte("the original"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(o.Image+".migrating", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ensure(t, o)
	if got, err := os.ReadFile(filepath.Join(o.Dir, "notes")); err != nil || string(got) != "in the image" {
		t.Fatalf("workspace file = %q, %v; want the image's", got, err)
	}
	if fileExists(o.Image + ".migrating") {
		t.Fatal("the move's marker is still there")
	}
	unmount(t, o.Dir)
	if entries, _ := os.ReadDir(o.Dir); len(entries) != 0 {
		t.Fatalf("the originals are still under the mount: %v", entries)
	}
}

func TestWorkspaceConcurrentEnsuresMountOnce(t *testing.T) {
	t.Parallel()
	o := setup(t)
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- workspace.Ensure(context.Background(), o) }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("Ensure: %v", err)
		}
	}
	if n := mountsAt(t, o.Dir); n != 1 {
		t.Fatalf("%d mounts at the workspace; want 1", n)
	}
}

func TestWorkspaceReleaseUnmountsAndKeepsTheImage(t *testing.T) {
	t.Parallel()
	o := setup(t)
	ensure(t, o)
	os.WriteFile(filepath.Join(o.Dir, "kept"), []byte("x"), 0o600)
	if err := workspace.Release(filepath.Dir(o.Image)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if n := mountsAt(t, o.Dir); n != 0 {
		t.Fatalf("%d mounts at the workspace after Release", n)
	}
	ensure(t, o)
	if _, err := os.Stat(filepath.Join(o.Dir, "kept")); err != nil {
		t.Fatalf("after Release and Ensure: %v", err)
	}
}

func TestWorkspaceAnImageDeletedWhileMountedIsUnmountedAtTheNextEnsure(t *testing.T) {
	t.Parallel()
	o := setup(t)
	ensure(t, o)
	if err := os.Remove(o.Image); err != nil {
		t.Fatal(err)
	}
	other := o
	other.Dir = filepath.Join(filepath.Dir(o.Dir), "beta")
	other.Image = filepath.Join(filepath.Dir(o.Image), "beta.img")
	ensure(t, other)
	if n := mountsAt(t, o.Dir); n != 0 {
		t.Fatalf("the deleted image is still mounted (%d mounts); it holds its reserved space", n)
	}
}

// Ensure confirms a workspace it mounted before with a few stats; whatever
// changed behind its back since, it must see it as a full Ensure would.
func TestWorkspaceEnsureSeesWhatChangedBehindItsBack(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		change  func(t *testing.T, o workspace.Options)
		wantErr string
		check   func(t *testing.T, o workspace.Options)
	}{
		{"An_image_unmounted_behind_its_back_is_mounted_again_with_its_files", func(t *testing.T, o workspace.Options) {
			unmount(t, o.Dir)
		}, "", func(t *testing.T, o workspace.Options) {
			if got, err := os.ReadFile(filepath.Join(o.Dir, "kept")); err != nil || string(got) != "x" {
				t.Fatalf("file written before the unmount = %q, %v; want it back from the image", got, err)
			}
		}},
		{"Another_filesystem_mounted_over_the_workspace_is_refused", func(t *testing.T, o workspace.Options) {
			if err := unix.Mount("tmpfs", o.Dir, "tmpfs", 0, "size=1m"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unmount(t, o.Dir) })
		}, "another filesystem is mounted", nil},
		{"Another_image_on_the_same_loop_device_is_refused", func(t *testing.T, o workspace.Options) {
			// The device the unmount frees is attached to another file and
			// mounted there: same device number, another image behind it.
			other := filepath.Join(t.TempDir(), "other.img")
			if out, err := exec.Command("mkfs.ext4", "-q", "-F", other, "8M").CombinedOutput(); err != nil {
				t.Fatalf("mkfs.ext4: %v: %s", err, out)
			}
			var st unix.Stat_t
			if err := unix.Stat(o.Dir, &st); err != nil {
				t.Fatal(err)
			}
			loop := fmt.Sprintf("/dev/loop%d", unix.Minor(st.Dev))
			image, _ := filepath.EvalSymlinks(o.Image)
			unmount(t, o.Dir)
			for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				out, err := exec.Command("losetup", loop, other).CombinedOutput()
				if err == nil {
					break
				}
				b, _ := os.ReadFile(fmt.Sprintf("/sys/block/loop%d/loop/backing_file", unix.Minor(st.Dev)))
				if held := strings.TrimSpace(string(b)); held != "" && held != image {
					// A parallel test took the device: any other will do.
					out, err = exec.Command("losetup", "--find", "--show", other).CombinedOutput()
					if err != nil {
						t.Fatalf("losetup --find: %v: %s", err, out)
					}
					loop = strings.TrimSpace(string(out))
					break
				}
				if time.Now().After(deadline) { // still held by the image it had
					t.Fatalf("losetup %s: %v: %s", loop, err, out)
				}
			}
			t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
			if out, err := exec.Command("mount", loop, o.Dir).CombinedOutput(); err != nil {
				t.Fatalf("mount: %v: %s", err, out)
			}
			t.Cleanup(func() { unmount(t, o.Dir) })
		}, "another filesystem is mounted", nil},
		{"An_image_deleted_while_mounted_is_replaced_by_a_fresh_one", func(t *testing.T, o workspace.Options) {
			if err := os.Remove(o.Image); err != nil {
				t.Fatal(err)
			}
		}, "", func(t *testing.T, o workspace.Options) {
			if fi, err := os.Stat(o.Image); err != nil || fi.Size() != o.Bytes {
				t.Fatalf("image %v, %v; want a fresh one of %d bytes", fi, err, o.Bytes)
			}
			if _, err := os.Stat(filepath.Join(o.Dir, "kept")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the deleted image's file is still in the workspace (%v)", err)
			}
		}},
		{"An_image_grown_behind_its_back_is_brought_back_to_the_quota", func(t *testing.T, o workspace.Options) {
			if err := os.Truncate(o.Image, 2*o.Bytes); err != nil {
				t.Fatal(err)
			}
		}, "", func(t *testing.T, o workspace.Options) {
			if fi, err := os.Stat(o.Image); err != nil || fi.Size() != o.Bytes {
				t.Fatalf("image %v, %v; want it at the quota, %d bytes", fi, err, o.Bytes)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := setup(t)
			ensure(t, o)
			if err := os.WriteFile(filepath.Join(o.Dir, "kept"), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			ensure(t, o) // the steady state, recorded
			tc.change(t, o)
			err := workspace.Ensure(context.Background(), o)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Ensure = %v; want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Ensure: %v", err)
			}
			if n := mountsAt(t, o.Dir); n != 1 {
				t.Fatalf("%d mounts at the workspace; want 1", n)
			}
			if st := statfs(t, o.Dir); st.Type != unix.EXT4_SUPER_MAGIC {
				t.Fatalf("workspace is on filesystem type %#x, not its ext4 image", st.Type)
			}
			tc.check(t, o)
		})
	}
}

// unmount takes the workspace's image away as a reboot would (a forked
// process of a parallel test may hold it busy for a moment).
func unmount(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := unix.Unmount(dir, 0)
		if err == nil {
			return
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			t.Fatalf("cannot unmount %s: %v", dir, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
