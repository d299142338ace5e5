package images_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/godbus/dbus/v5"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/services/images"
)

var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
	agentDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if agentDir != "" {
		os.RemoveAll(agentDir)
	}
	os.Exit(code)
}

// agentBinary builds a static berth-agent once for the package.
func agentBinary(t *testing.T) string {
	t.Helper()
	agentOnce.Do(func() {
		if p := os.Getenv("BERTH_TEST_AGENT_BINARY"); p != "" {
			agentBin = p
			return
		}
		agentDir, agentErr = testenv.OpenDir("berth-images-test-")
		if agentErr != nil {
			return
		}
		_, file, _, _ := runtime.Caller(0)
		agentBin = filepath.Join(agentDir, "berth-agent")
		cmd := exec.Command("go", "build", "-trimpath", "-o", agentBin, "./cmd/berth-agent")
		cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentErr = fmt.Errorf("cannot build berth-agent: %v\n%s", err, out)
		}
	})
	if agentErr != nil {
		t.Fatal(agentErr)
	}
	return agentBin
}

func nonce() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// writeConfig writes berth.toml with the agent binary set and returns its
// loaded form and path.
func writeConfig(t *testing.T, body string) (*config.Config, string) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "berth.toml")
	text := fmt.Sprintf("[scheduler]\nagent_binary = %q\n\n%s", agentBinary(t), body)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("config refused: %v\n%s", err, text)
	}
	return cfg, path
}

// needBusybox fails (CI) or skips unless Debian's busybox-static is there:
// the default agent image needs it.
func needBusybox(t *testing.T) {
	t.Helper()
	_, err := os.Stat(imagectl.DefaultBusybox)
	testenv.Need(t, err == nil, "busybox-static is not installed")
}

// needBase fails (CI) or skips unless berth-base:bookworm is present.
func needBase(t *testing.T, cli *client.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := cli.ImageInspect(ctx, config.DefaultBaseImage)
	testenv.Need(t, err == nil, "%s is missing: run scripts/base-image.sh (%v)", config.DefaultBaseImage, err)
}

type fixture struct {
	svc *images.Service
	cli *client.Client
	dir string
}

func newService(t *testing.T, cfg *config.Config) *fixture {
	t.Helper()
	return newServiceWith(t, cfg, images.Options{})
}

func newServiceWith(t *testing.T, cfg *config.Config, opts images.Options) *fixture {
	t.Helper()
	cli := testdocker.Engine(t)
	dir := t.TempDir()
	opts.Engine, opts.Version = cli, "1.2.3+test"
	svc, err := images.New(cfg, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	return &fixture{svc: svc, cli: cli, dir: dir}
}

// removeImagesAtEnd removes the test's images from the engine when it ends.
func (f *fixture) removeImagesAtEnd(t *testing.T, tags ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, tag := range tags {
			_, _ = f.cli.ImageRemove(ctx, tag, client.ImageRemoveOptions{PruneChildren: true})
		}
	})
}

func (f *fixture) present(t *testing.T, tag string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := f.cli.ImageInspect(ctx, tag)
	if err != nil && !cerrdefs.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// onPrivateBus exports the service on a private bus and returns the bus.
func (f *fixture) onPrivateBus(t *testing.T) *testbus.Bus {
	t.Helper()
	b := testbus.Start(t, testbus.Options{})
	if err := f.svc.Export(b.Conn(t)); err != nil {
		t.Fatal(err)
	}
	return b
}

func imagesObject(conn *dbus.Conn) dbus.BusObject {
	return conn.Object(bus.ImagesName, bus.ImagesPath)
}

func ensure(t *testing.T, f *fixture, agent string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tag, err := f.svc.EnsureIsolationImage(ctx, agent)
	if err != nil {
		t.Fatalf("EnsureIsolationImage(%s): %v", agent, err)
	}
	return tag
}

// allowNobody adds a bus policy that lets nobody call everything on
// dev.berth.Images1, so the service's own check is what refuses.
func allowNobody(t *testing.T, b *testbus.Bus) {
	t.Helper()
	policy := `<busconfig>
  <policy user="nobody">
    <allow send_destination="` + bus.ImagesName + `"/>
  </policy>
</busconfig>
`
	if err := os.WriteFile(filepath.Join(b.Dir, "system.d", "zz-test-nobody.conf"), []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := b.Conn(t).BusObject().Call("org.freedesktop.DBus.ReloadConfig", 0).Err; err != nil {
		t.Fatalf("cannot reload bus config: %v", err)
	}
}

type imageT = images.Image

func testdockerEngine(t *testing.T) *client.Client { return testdocker.Engine(t) }

func testenvNeedApt(t *testing.T) {
	t.Helper()
	testenv.Need(t, imagectl.HostHasApt(), "the host has no apt-get")
}

// writeConfigAt rewrites the config at path (the agent binary kept).
func writeConfigAt(t *testing.T, path, body string) (*config.Config, string) {
	t.Helper()
	text := fmt.Sprintf("[scheduler]\nagent_binary = %q\n\n%s", agentBinary(t), body)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("config refused: %v", err)
	}
	return cfg, path
}

func envOf(t *testing.T, cfg *config.Config, agent string) string {
	t.Helper()
	a, err := cfg.Agent(agent)
	if err != nil {
		t.Fatal(err)
	}
	return a.Image.EnvVars["RUN_NONCE"]
}

func engineArch(t *testing.T, cli *client.Client) string {
	t.Helper()
	v, err := cli.ServerVersion(context.Background(), client.ServerVersionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return v.Arch
}
