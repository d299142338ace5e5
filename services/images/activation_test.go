package images_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/internal/version"
)

// buildImaged builds berth-imaged into an open directory, with extra go
// build flags.
func buildImaged(t *testing.T, flags ...string) string {
	t.Helper()
	dir, err := testenv.OpenDir("berth-imaged-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", append(append([]string{"build", "-o", filepath.Join(dir, "berth-imaged")}, flags...), "./cmd/berth-imaged")...)
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cannot build berth-imaged: %v\n%s", err, out)
	}
	return dir
}

func TestImagedIsActivatedByACallExitsWhenIdleAndIsActivatedAgain(t *testing.T) {
	t.Parallel()
	testdocker.Engine(t)
	binDir := buildImaged(t)
	_, cfgPath := writeConfig(t, "")
	b := testbus.Start(t, testbus.Options{BinDir: binDir, Env: []string{
		"BERTH_CONFIG=" + cfgPath, "BERTH_STATE_DIR=" + t.TempDir(), "BERTH_IMAGED_IDLE_EXIT=1s",
	}})
	conn := b.Conn(t)
	if err := conn.AddMatchSignal(dbus.WithMatchSender("org.freedesktop.DBus"), dbus.WithMatchMember("NameOwnerChanged"), dbus.WithMatchArg(0, bus.ImagesName)); err != nil {
		t.Fatal(err)
	}
	owners := make(chan *dbus.Signal, 16)
	conn.Signal(owners)

	for round := 1; round <= 2; round++ {
		var list []map[string]dbus.Variant
		if err := imagesObject(conn).Call(bus.ImagesInterface+".ListImages", 0).Store(&list); err != nil {
			t.Fatalf("round %d: ListImages did not activate berth-imaged: %v", round, err)
		}
		// Wait for the name to be released: the idle exit.
		deadline := time.After(30 * time.Second)
		for released := false; !released; {
			select {
			case sig := <-owners:
				released = len(sig.Body) == 3 && sig.Body[2] == ""
			case <-deadline:
				t.Fatalf("round %d: berth-imaged did not exit after 1s idle", round)
			}
		}
	}
}

func TestImagedExitsWithTheIdleStatus(t *testing.T) {
	t.Parallel()
	testdocker.Engine(t)
	binDir := buildImaged(t)
	_, cfgPath := writeConfig(t, "")
	b := testbus.Start(t, testbus.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "berth-imaged"), "--config", cfgPath, "--state-dir", t.TempDir(), "--idle-exit", "500ms")
	cmd.Env = append(os.Environ(), "DBUS_SYSTEM_BUS_ADDRESS="+b.Address)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != daemon.ExitIdle {
		t.Fatalf("berth-imaged exited with %v, want status %d\n%s", err, daemon.ExitIdle, out)
	}
}

func TestIsolationImagesAreTaggedWithTheVersionTheBinaryWasStampedWith(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	needBusybox(t)
	// As packaging stamps a package version (with '+', which a tag cannot hold).
	binDir := buildImaged(t, "-ldflags="+version.LDFlag("7.8.9+1.gfeed"))
	_, cfgPath := writeConfig(t, "[[agents]]\nid = \"boxed\"\n[agents.container_mode]\nenabled = true\n")
	b := testbus.Start(t, testbus.Options{BinDir: binDir, Env: []string{
		"BERTH_CONFIG=" + cfgPath, "BERTH_STATE_DIR=" + t.TempDir(),
	}})
	var tag string
	call := imagesObject(b.Conn(t)).Call(bus.ImagesInterface+".EnsureIsolationImage", 0, "boxed")
	if err := call.Store(&tag); err != nil {
		t.Fatalf("EnsureIsolationImage(boxed): %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = cli.ImageRemove(ctx, tag, client.ImageRemoveOptions{})
	})
	if want := imagectl.IsolatedRepository + ":7.8.9_1.gfeed-"; !strings.HasPrefix(tag, want) {
		t.Errorf("the isolation image is %q, want it tagged %s<hash>", tag, want)
	}
}
