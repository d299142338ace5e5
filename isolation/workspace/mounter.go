package workspace

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/coreos/go-systemd/v22/unit"
	"github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/mountinfo"
)

// A mounter mounts an image at a directory and takes it away again.
type mounter interface {
	mount(ctx context.Context, image, dir string) error
	unmount(ctx context.Context, dir string) error
}

func mounterOf(o Options) mounter {
	if o.Systemd {
		return systemdMounter{}
	}
	return directMounter{}
}

// directMounter mounts in this process's mount namespace with mount(8),
// which finds a free loop device, reuses one already attached to the image
// (never two devices on one image) and lets the kernel free it at unmount.
type directMounter struct{}

func (directMounter) mount(ctx context.Context, image, dir string) error {
	mountBin, err := tool("mount", "util-linux")
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, mountBin, "-t", "ext4", "-o", MountOptions, image, dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cannot mount image %s: %w: %s", image, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (directMounter) unmount(ctx context.Context, dir string) error {
	if err := unmountSoon(ctx, dir); err != nil {
		return fmt.Errorf("cannot unmount %s: %w", dir, err)
	}
	return waitDetached(ctx, dir)
}

// unmountSoon unmounts dir, trying again for a second while it is busy: a
// process forked anywhere in the scheduler holds copies of its open files
// until it executes, which can make a workspace busy for a moment.
func unmountSoon(ctx context.Context, dir string) error {
	deadline := time.Now().Add(time.Second)
	for {
		err := unix.Unmount(dir, 0)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// systemdMounter mounts through a transient mount unit: systemd mounts in
// the host's namespace and the mount propagates into the scheduler's.
type systemdMounter struct{}

// UnitName is the mount unit of a workspace (systemd names a mount unit
// after its path).
func UnitName(dir string) string { return unit.UnitNamePathEscape(dir) + ".mount" }

// unitProperties are the transient mount unit's properties.
func unitProperties(image, dir string) []sdbus.Property {
	return []sdbus.Property{
		{Name: "Description", Value: dbus.MakeVariant("berth workspace quota of " + dir)},
		{Name: "What", Value: dbus.MakeVariant(image)},
		{Name: "Where", Value: dbus.MakeVariant(dir)},
		{Name: "Type", Value: dbus.MakeVariant("ext4")},
		{Name: "Options", Value: dbus.MakeVariant(MountOptions)},
	}
}

func (systemdMounter) mount(ctx context.Context, image, dir string) error {
	conn, err := sdbus.NewSystemdConnectionContext(ctx)
	if err != nil {
		return fmt.Errorf("cannot reach systemd: %w", err)
	}
	defer conn.Close()
	name := UnitName(dir)
	for attempt := 0; ; attempt++ {
		done := make(chan string, 1)
		_, err = conn.StartTransientUnitContext(ctx, name, "fail", unitProperties(image, dir), done)
		var derr dbus.Error
		if err != nil && attempt == 0 && errors.As(err, &derr) && derr.Name == "org.freedesktop.systemd1.UnitExists" {
			// A unit left from a failed or stopped mount: forget it.
			_ = conn.ResetFailedUnitContext(ctx, name)
			if _, err := conn.StopUnitContext(ctx, name, "replace", nil); err != nil {
				return fmt.Errorf("cannot replace mount unit %s: %w", name, err)
			}
			if err := waitGone(ctx, conn, name); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("cannot start mount unit %s: %w", name, err)
		}
		select {
		case result := <-done:
			if result != "done" {
				return fmt.Errorf("systemd could not mount image %s (job %s; see journalctl -u %s)", image, result, name)
			}
			return nil
		case <-ctx.Done():
			return fmt.Errorf("mount unit %s did not start: %w", name, ctx.Err())
		}
	}
}

func (systemdMounter) unmount(ctx context.Context, dir string) error {
	conn, err := sdbus.NewSystemdConnectionContext(ctx)
	if err != nil {
		return fmt.Errorf("cannot reach systemd: %w", err)
	}
	defer conn.Close()
	name := UnitName(dir)
	done := make(chan string, 1)
	if _, err := conn.StopUnitContext(ctx, name, "replace", done); err != nil {
		return fmt.Errorf("cannot stop mount unit %s: %w", name, err)
	}
	select {
	case result := <-done:
		if result != "done" {
			return fmt.Errorf("systemd could not unmount %s (job %s)", dir, result)
		}
	case <-ctx.Done():
		return fmt.Errorf("mount unit %s did not stop: %w", name, ctx.Err())
	}
	return waitDetached(ctx, dir)
}

// waitGone waits until systemd has forgotten a stopped unit.
func waitGone(ctx context.Context, conn *sdbus.Conn, name string) error {
	for {
		props, err := conn.GetUnitPropertiesContext(ctx, name)
		if err != nil || props["LoadState"] == "not-found" || props["ActiveState"] == "inactive" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("mount unit %s did not stop: %w", name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitDetached waits until nothing is mounted at dir any more in this
// namespace (an unmount by systemd propagates; the kernel may free a loop
// device a moment after its last unmount).
func waitDetached(ctx context.Context, dir string) error {
	deadline := time.Now().Add(5 * time.Second)
	point := resolved(dir)
	for {
		mounts, err := readMountinfo()
		if err != nil {
			return err
		}
		busy := slices.ContainsFunc(mounts, func(m mountinfo.Mount) bool {
			return m.Point == point && backingFile(m.Source) != ""
		})
		if !busy {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is still mounted", dir)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
