package ctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testbus"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/services/images"
)

// imagesOnBus runs a real berth-imaged service on a private bus with the
// config body and returns a cli connected to it.
func imagesOnBus(t *testing.T, body string) (*cli, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	engine := testdocker.Engine(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := engine.ImageInspect(ctx, config.DefaultBaseImage)
	testenv.Need(t, err == nil, "%s is missing: run scripts/base-image.sh", config.DefaultBaseImage)
	agent := os.Getenv("BERTH_TEST_AGENT_BINARY")
	if agent == "" {
		dir, err := testenv.OpenDir("berthctl-container-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		agent = buildStaticAgent(t, dir)
	}
	path := filepath.Join(t.TempDir(), "berth.toml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf("[scheduler]\nagent_binary = %q\n%s", agent, body)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := images.New(cfg, t.TempDir(), images.Options{Engine: engine, Version: "1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	b := testbus.Start(t, testbus.Options{})
	if err := svc.Export(b.Conn(t)); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	return &cli{out: &out, errOut: &errOut, conn: b.Conn(t)}, &out, &errOut
}

func buildStaticAgent(t *testing.T, dir string) string {
	t.Helper()
	t.Setenv("CGO_ENABLED", "0")
	bin, err := testenv.Build(dir, "berth-agent", "../../cmd/berth-agent")
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func removeAtEnd(t *testing.T, tags ...string) {
	t.Cleanup(func() {
		cli, err := client.New(client.FromEnv)
		if err != nil {
			return
		}
		defer cli.Close()
		for _, tag := range tags {
			_, _ = cli.ImageRemove(context.Background(), tag, client.ImageRemoveOptions{PruneChildren: true})
		}
	})
}

func TestContainerBuildFollowsTheJobAndPrintsTheTag(t *testing.T) {
	c, out, errOut := imagesOnBus(t, fmt.Sprintf("[[agents]]\nid = \"ops\"\n[agents.container_mode]\nenabled = true\n[agents.image_config]\nenabled = true\nenv_vars = { RUN_NONCE = \"%d\" }\n", time.Now().UnixNano()))
	if err := c.container([]string{"build", "--agent", "ops"}); err != nil {
		t.Fatalf("container build: %v\n%s", err, errOut)
	}
	tag := strings.TrimSpace(out.String())
	removeAtEnd(t, tag)
	if !strings.HasPrefix(tag, "berth-isolated:1.2.3-") {
		t.Fatalf("container build printed %q on stdout, want the isolation tag", out)
	}
	if !strings.Contains(errOut.String(), "] Step 1/") {
		t.Fatalf("container build showed no steps:\n%s", errOut)
	}
	out.Reset()
	if err := c.container([]string{"images"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), tag) || !strings.Contains(out.String(), "ops") {
		t.Fatalf("container images does not list %s for ops:\n%s", tag, out)
	}
	out.Reset()
	if err := c.container([]string{"dockerfile", "--agent", "ops"}); err != nil || !strings.Contains(out.String(), "ENV RUN_NONCE=") {
		t.Fatalf("container dockerfile: %v\n%s", err, out)
	}
}

func TestContainerBuildOfAnUnknownPackageFailsWithItsName(t *testing.T) {
	c, _, _ := imagesOnBus(t, "[[agents]]\nid = \"ops\"\n[agents.image_config]\nenabled = true\npackages = [\"berth-no-such-package\"]\n")
	err := c.container([]string{"build", "--agent", "ops"})
	var ee *exitErr
	if !errors.As(err, &ee) || ee.code != ExitFailed || !strings.Contains(err.Error(), "berth-no-such-package") {
		t.Fatalf("container build error = %v, want exit %d naming the package", err, ExitFailed)
	}
}
