package images_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/daemon"
	"github.com/berth-dev/berth/internal/testbus"
	"github.com/berth-dev/berth/internal/testdocker"
	"github.com/berth-dev/berth/internal/testenv"
)

// buildImaged builds berth-imaged into an open directory.
func buildImaged(t *testing.T) string {
	t.Helper()
	dir, err := testenv.OpenDir("berth-imaged-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "berth-imaged"), "./cmd/berth-imaged")
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
