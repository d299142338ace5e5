// Package workspace gives an agent's workspace an enforced size limit
// (workspace_quota): a preallocated ext4 image of its own, loop-mounted at
// the workspace, so a run that fills its workspace meets ENOSPC inside the
// image and never the host's filesystem that holds berth's databases
// (docs/adr/0015-workspace-quota.md).
//
// Ensure is idempotent and safe to repeat after a crash at any point: an
// image already mounted at the workspace is left alone, an existing
// workspace's files move into the image once, a larger quota grows the
// filesystem and a smaller one shrinks it only while what is stored fits.
// A mount it made or found is remembered and confirmed at the next call
// with two stats and a read of the loop device's sysfs file (steady.go);
// only a change reads the mount table again.
package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/durable"
)

// Options say which workspace gets which quota.
type Options struct {
	// Dir is the workspace: the image is mounted here. It is created
	// (0700) when missing; the image's root directory copies its owner and
	// mode.
	Dir string
	// Image is the agent's filesystem image (its directory is created
	// 0700). It is kept when the agent goes away; see the ADR.
	Image string
	// Bytes is workspace_quota: the image's size, rounded down to 4 KiB.
	// 0 means no quota: Ensure does nothing.
	Bytes int64
	// Systemd mounts through a transient .mount unit, in the host's mount
	// namespace (the scheduler unit's own namespace is private, and a mount
	// made there would be invisible to dockerd and to the runs' units).
	// Otherwise Ensure mounts itself, with mount(8) -o loop.
	Systemd bool
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// MountOptions are the image's mount options: no device nodes and no
// set-uid programs in a workspace.
const MountOptions = "loop,nodev,nosuid"

// ensureTimeout bounds one Ensure (mkfs, a move of an existing workspace, a
// resize); the caller's deadline applies too.
const ensureTimeout = 2 * time.Minute

// Ensure makes opts.Dir hold at most opts.Bytes: it creates, grows, shrinks
// and mounts the image as needed. Any error means the quota is not
// enforced; the caller must not use the workspace.
func Ensure(ctx context.Context, opts Options) (err error) {
	if opts.Bytes == 0 {
		return nil
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("cannot enforce workspace_quota %s on %s: %w", Size(opts.Bytes), opts.Dir, err)
		}
	}()
	if opts.Bytes < 0 || opts.Dir == "" || opts.Image == "" || !filepath.IsAbs(opts.Dir) || !filepath.IsAbs(opts.Image) {
		return errors.New("needs an absolute workspace, an absolute image path and a positive size")
	}
	if os.Geteuid() != 0 {
		return errors.New("mounting a workspace image needs berth-scheduler to run as root (workspace_quota = 0 runs without a quota)")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	opts.Bytes &^= 4095
	opts.Dir, opts.Image = filepath.Clean(opts.Dir), filepath.Clean(opts.Image)
	ctx, cancel := context.WithTimeout(ctx, ensureTimeout)
	defer cancel()
	release, err := lockImage(ctx, opts.Image)
	if err != nil {
		return err
	}
	defer release()
	e := ensurer{opts: opts, m: mounterOf(opts)}
	return inStartNamespace(func() error {
		// The steady state: mounted as recorded, at this size (steady.go).
		if stillMounted(opts) {
			return nil
		}
		drop(opts.Image)
		unmountDeleted(ctx, filepath.Dir(opts.Image), e.m, opts.Logger)
		if err := e.ensure(ctx); err != nil {
			return err
		}
		remember(opts)
		return nil
	})
}

// SweepDeleted unmounts the workspace images like those in imageDir that
// were deleted while mounted. Ensure does it whenever it has more to do
// than confirm a mount; the scheduler calls it too when its agents or
// quotas change (an agent removed with its image). systemd is
// Options.Systemd; a nil logger is slog.Default().
func SweepDeleted(ctx context.Context, imageDir string, systemd bool, logger *slog.Logger) {
	if logger == nil {
		logger = slog.Default()
	}
	ctx, cancel := context.WithTimeout(ctx, ensureTimeout)
	defer cancel()
	m := mounterOf(Options{Systemd: systemd})
	_ = inStartNamespace(func() error {
		unmountDeleted(ctx, filepath.Clean(imageDir), m, logger)
		return nil
	})
}

// unmountDeleted takes away workspace images that were deleted while
// mounted (an agent's image the admin removed, a test's state directory):
// nobody can mount them again, and they hold their reserved space until
// they are unmounted. It takes those of any directory named like imageDir
// (a removed state directory's too).
func unmountDeleted(ctx context.Context, imageDir string, mnt mounter, log *slog.Logger) {
	mounts, err := readMountinfo()
	if err != nil {
		return
	}
	for _, m := range mounts {
		b, ok := strings.CutSuffix(backingFile(m.Source), " (deleted)")
		if !ok || m.FSType != "ext4" || filepath.Base(filepath.Dir(b)) != filepath.Base(imageDir) || filepath.Ext(b) != ".img" {
			continue
		}
		err := mnt.unmount(ctx, m.Point)
		if err != nil {
			// Still in use: detach it now, the kernel frees it when the
			// last user goes.
			err = unix.Unmount(m.Point, unix.MNT_DETACH)
		}
		if err != nil {
			log.Warn("cannot unmount a deleted workspace image", "dir", m.Point, "image", b, "err", err)
			continue
		}
		log.Info("unmounted a deleted workspace image", "dir", m.Point, "image", b)
	}
}

type ensurer struct {
	opts Options
	m    mounter
}

func (e ensurer) ensure(ctx context.Context) error {
	o := e.opts
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return fmt.Errorf("cannot create the workspace: %w", err)
	}
	state, where, err := mountState(o.Dir, o.Image)
	if err != nil {
		return err
	}
	switch state {
	case mountedOther:
		return fmt.Errorf("another filesystem is mounted at %s (not %s)", o.Dir, o.Image)
	case mounted:
		return e.resize(ctx)
	}
	if where != "" {
		return fmt.Errorf("image %s is already mounted at %s; an image is mounted once", o.Image, where)
	}
	var root unix.Stat_t
	if err := unix.Stat(o.Dir, &root); err != nil {
		return fmt.Errorf("cannot check the workspace: %w", err)
	}
	if err := e.create(ctx); err != nil {
		return err
	}
	if err := e.mount(ctx); err != nil {
		return err
	}
	// The image's root is the workspace as the scheduler made it.
	if err := os.Chown(o.Dir, int(root.Uid), int(root.Gid)); err != nil {
		return fmt.Errorf("cannot hand the workspace's root over: %w", err)
	}
	if err := os.Chmod(o.Dir, fs.FileMode(root.Mode&0o777)); err != nil {
		return fmt.Errorf("cannot set the mode of the workspace's root: %w", err)
	}
	return e.resize(ctx)
}

// create makes the image when there is none, with the workspace's current
// files in it. migrating marks a move in progress: once the image exists,
// the files left in Dir are copies and are removed.
func (e ensurer) create(ctx context.Context) error {
	o := e.opts
	migrating := o.Image + ".migrating"
	_, imgErr := os.Stat(o.Image)
	_, markErr := os.Stat(migrating)
	switch {
	case imgErr == nil && markErr == nil:
		return e.finishMove(migrating)
	case imgErr == nil:
		if empty, err := isEmpty(o.Dir); err != nil {
			return err
		} else if !empty {
			return fmt.Errorf("the workspace has files but is not mounted, and its image %s already exists: move one of them away", o.Image)
		}
		return nil
	case !errors.Is(imgErr, fs.ErrNotExist):
		return fmt.Errorf("cannot check image: %w", imgErr)
	}
	if err := os.MkdirAll(filepath.Dir(o.Image), 0o700); err != nil {
		return fmt.Errorf("cannot create the image directory: %w", err)
	}
	empty, err := isEmpty(o.Dir)
	if err != nil {
		return err
	}
	if !empty {
		used, err := diskUsage(o.Dir)
		if err != nil {
			return err
		}
		// ext4 keeps a few percent for its metadata and journal.
		if used > o.Bytes/100*92 {
			return fmt.Errorf("the workspace holds %s, more than a %s image can take: raise workspace_quota or make room", Size(used), Size(o.Bytes))
		}
		if err := writeSynced(migrating); err != nil {
			return err
		}
		o.Logger.Info("moving the workspace's files into its quota image", "dir", o.Dir, "image", o.Image, "bytes", used)
	}
	tmp := o.Image + ".new"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cannot remove a half-made image: %w", err)
	}
	if err := e.makeImage(ctx, tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, o.Image); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("cannot put the image in place: %w", err)
	}
	if err := durable.SyncDir(filepath.Dir(o.Image)); err != nil {
		return err
	}
	if empty {
		return nil
	}
	return e.finishMove(migrating)
}

// makeImage writes a preallocated ext4 filesystem of o.Bytes at path whose
// root is a copy of the workspace (its files, owner and mode).
func (e ensurer) makeImage(ctx context.Context, path string) error {
	o := e.opts
	mkfs, err := tool("mkfs.ext4", "e2fsprogs")
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("cannot create image: %w", err)
	}
	defer f.Close()
	if err := reserve(f, o.Bytes, o.Logger); err != nil {
		return err
	}
	// Lazy inode tables and journal make mkfs take milliseconds whatever
	// the size; nodiscard keeps the reservation (a discard punches holes).
	// -m 0: no blocks reserved for root, the agent may use all of it.
	args := []string{"-q", "-F", "-t", "ext4", "-m", "0", "-L", "berth-workspace",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", "-d", o.Dir, path}
	if out, err := exec.CommandContext(ctx, mkfs, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 failed: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("cannot sync image: %w", err)
	}
	return nil
}

// finishMove removes what the image now holds from under the mount point
// (it would be hidden there, and take space on the host's disk).
func (e ensurer) finishMove(migrating string) error {
	entries, err := os.ReadDir(e.opts.Dir)
	if err != nil {
		return fmt.Errorf("cannot read the workspace: %w", err)
	}
	for _, ent := range entries {
		if err := os.RemoveAll(filepath.Join(e.opts.Dir, ent.Name())); err != nil {
			return fmt.Errorf("cannot remove the moved files: %w", err)
		}
	}
	if err := os.Remove(migrating); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cannot finish the move: %w", err)
	}
	return durable.SyncDir(filepath.Dir(migrating))
}

func (e ensurer) mount(ctx context.Context) error {
	if err := e.m.mount(ctx, e.opts.Image, e.opts.Dir); err != nil {
		return err
	}
	// Under systemd the mount is made in the host's namespace and reaches
	// the scheduler's own only by propagation. Where the root mount is not
	// shared (systemd in some containers leaves it private) the scheduler
	// would go on working on the directory beneath the image: it would hand
	// the wrong root to the agent and could resize a mounted image. Fail
	// closed instead, saying what to fix.
	if state, _, err := mountState(e.opts.Dir, e.opts.Image); err != nil || state != mounted {
		return fmt.Errorf("the image %s was mounted at %s but the mount does not show in this process's mount namespace (is / a shared mount? mount --make-rshared /)", e.opts.Image, e.opts.Dir)
	}
	// mkfs makes lost+found; an agent has no use for it and e2fsck makes
	// it again when it needs it.
	os.Remove(filepath.Join(e.opts.Dir, "lost+found"))
	e.opts.Logger.Info("workspace quota mounted", "dir", e.opts.Dir, "image", e.opts.Image, "bytes", e.opts.Bytes)
	return nil
}

// resize brings a mounted image to o.Bytes. ext4 resizes offline here (the
// scheduler unit has no loop devices and no CAP_SYS_RESOURCE for an online
// resize): unmount, check, resize, mount again. A workspace still in use
// keeps its old size, which is still enforced.
func (e ensurer) resize(ctx context.Context) error {
	o := e.opts
	fi, err := os.Stat(o.Image)
	if err != nil {
		return fmt.Errorf("cannot check image: %w", err)
	}
	size := fi.Size()
	if size == o.Bytes {
		return nil
	}
	if o.Bytes < size {
		var st unix.Statfs_t
		if err := unix.Statfs(o.Dir, &st); err != nil {
			return fmt.Errorf("cannot measure the workspace: %w", err)
		}
		used := int64(st.Blocks-st.Bfree) * st.Bsize
		if used > o.Bytes/100*92 {
			return fmt.Errorf("cannot shrink the workspace from %s to %s: it holds %s", Size(size), Size(o.Bytes), Size(used))
		}
	}
	resize2fs, err := tool("resize2fs", "e2fsprogs")
	if err != nil {
		return err
	}
	e2fsck, err := tool("e2fsck", "e2fsprogs")
	if err != nil {
		return err
	}
	if err := e.m.unmount(ctx, o.Dir); err != nil {
		o.Logger.Warn("workspace is in use: its quota changes at a later run", "dir", o.Dir, "bytes", size, "want_bytes", o.Bytes, "err", err)
		return nil
	}
	resizeErr := func() error {
		if err := waitReleased(ctx, o.Image); err != nil {
			return err
		}
		if out, err := exec.CommandContext(ctx, e2fsck, "-f", "-p", o.Image).CombinedOutput(); err != nil {
			// 1: errors corrected, which is fine.
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				return fmt.Errorf("e2fsck failed: %w: %s", err, strings.TrimSpace(string(out)))
			}
		}
		if o.Bytes > size {
			f, err := os.OpenFile(o.Image, os.O_WRONLY, 0)
			if err != nil {
				return fmt.Errorf("cannot open image: %w", err)
			}
			err = reserve(f, o.Bytes, o.Logger)
			f.Close()
			if err != nil {
				return err
			}
		}
		if out, err := exec.CommandContext(ctx, resize2fs, o.Image, fmt.Sprintf("%dK", o.Bytes/1024)).CombinedOutput(); err != nil {
			return fmt.Errorf("resize2fs failed: %w: %s", err, strings.TrimSpace(string(out)))
		}
		if o.Bytes < size {
			if err := os.Truncate(o.Image, o.Bytes); err != nil {
				return fmt.Errorf("cannot truncate image: %w", err)
			}
		}
		return nil
	}()
	if err := e.m.mount(ctx, o.Image, o.Dir); err != nil {
		return errors.Join(resizeErr, err)
	}
	if resizeErr != nil {
		if o.Bytes < size {
			return resizeErr
		}
		o.Logger.Warn("cannot grow the workspace: its quota changes at a later run", "dir", o.Dir, "bytes", size, "want_bytes", o.Bytes, "err", resizeErr)
		return nil
	}
	o.Logger.Info("workspace quota resized", "dir", o.Dir, "image", o.Image, "bytes", o.Bytes, "was_bytes", size)
	return nil
}

// Release unmounts every image under imageDir that this process mounted
// itself (not through systemd). A scheduler without systemd calls it when
// it stops so its state can be removed; an image stays where it is.
func Release(imageDir string) error {
	return inStartNamespace(func() error { return release(filepath.Clean(imageDir)) })
}

func release(imageDir string) error {
	defer forget(imageDir)
	mounts, err := readMountinfo()
	if err != nil {
		return err
	}
	var errs []error
	for i := len(mounts) - 1; i >= 0; i-- {
		m := mounts[i]
		if b := backingFile(m.Source); b != "" && filepath.Dir(b) == imageDir {
			if err := unmountSoon(context.Background(), m.Point); err != nil {
				errs = append(errs, fmt.Errorf("cannot unmount workspace %s: %w", m.Point, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Size prints bytes as workspace_quota would ("64m", "1g").
func Size(b int64) string {
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"g", 1 << 30}, {"m", 1 << 20}, {"k", 1 << 10}} {
		if b >= u.n && b%u.n == 0 {
			return fmt.Sprintf("%d%s", b/u.n, u.suffix)
		}
	}
	if b >= 1<<20 {
		return fmt.Sprintf("%.1fm", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%d bytes", b)
}

// reserve makes f bytes long with every block allocated, so the host's
// disk never runs out under a workspace that has not filled its quota.
func reserve(f *os.File, bytes int64, log *slog.Logger) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, bytes)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOSPC):
		return fmt.Errorf("cannot reserve %s for the image: the disk of %s is full", Size(bytes), f.Name())
	case errors.Is(err, unix.EOPNOTSUPP):
		log.Warn("the filesystem cannot preallocate: the workspace image is sparse and its quota is not reserved", "image", f.Name())
		if err := f.Truncate(bytes); err != nil {
			return fmt.Errorf("cannot size image: %w", err)
		}
		return nil
	default:
		return fmt.Errorf("cannot reserve %s for the image: %w", Size(bytes), err)
	}
}

// tool finds an e2fsprogs or util-linux program (also in the sbin
// directories a non-login PATH may lack).
func tool(name, pkg string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("cannot find %s (install %s)", name, pkg)
}

func isEmpty(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, fmt.Errorf("cannot read the workspace: %w", err)
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if len(names) > 0 {
		return false, nil
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("cannot read the workspace: %w", err)
	}
	return true, nil
}

// diskUsage is what dir's files take on disk, as du(1) counts.
func diskUsage(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		total += st.Blocks * 512
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("cannot measure the workspace: %w", err)
	}
	return total, nil
}

func writeSynced(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err == nil {
		err = f.Sync()
		f.Close()
	}
	if err == nil {
		err = durable.SyncDir(filepath.Dir(path))
	}
	if err != nil {
		return fmt.Errorf("cannot mark the move: %w", err)
	}
	return nil
}

// images serializes Ensure per image within this process: a waiter gives
// up at its deadline.
var images sync.Map // image path → chan struct{} closed when released

func lockImage(ctx context.Context, image string) (func(), error) {
	for {
		mine := make(chan struct{})
		held, loaded := images.LoadOrStore(image, mine)
		if !loaded {
			return func() { images.Delete(image); close(mine) }, nil
		}
		select {
		case <-held.(chan struct{}):
		case <-ctx.Done():
			return nil, fmt.Errorf("image is busy: %w", ctx.Err())
		}
	}
}

// waitReleased waits for the kernel to free the image's loop device after
// its unmount; a device that stays is held by another mount (a container's).
func waitReleased(ctx context.Context, image string) error {
	deadline := time.Now().Add(3 * time.Second)
	for {
		loops := loopsOf(image)
		if len(loops) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("image is still in use (%s, a container's mount?)", strings.Join(loops, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ImagePath is where the scheduler keeps an agent's image:
// <state>/workspaces/<agent>.img.
func ImagePath(stateDir, agent string) string {
	return filepath.Join(stateDir, "workspaces", agent+".img")
}

// Why explains a workspace quota of bytes held by image (sandbox explain).
func Why(bytes int64, image string) string {
	if bytes == 0 {
		return "workspace_quota = 0: no quota; the workspace shares the disk of berth's state"
	}
	return fmt.Sprintf("workspace_quota %s: an ext4 image of its own (%s, preallocated), loop-mounted at the workspace; writes past it fail with ENOSPC",
		Size(bytes&^4095), image)
}
