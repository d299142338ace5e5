package imagectl_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testdocker"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

func buildAgent(t *testing.T) string {
	t.Helper()
	if prebuilt := os.Getenv("BERTH_TEST_AGENT_BINARY"); prebuilt != "" {
		return prebuilt
	}
	out := filepath.Join(t.TempDir(), "berth-agent")
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./cmd/berth-agent")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cannot build berth-agent: %v\n%s", err, b)
	}
	return out
}

func TestAgentImageIsBuiltOfflineOnceAndTaggedByItsContent(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	_, err := os.Stat(imagectl.DefaultBusybox)
	testenv.Need(t, err == nil, "busybox-static is not installed")
	img := imagectl.AgentImage{AgentBinary: buildAgent(t)}
	ctx := context.Background()
	tag, err := imagectl.Ensure(ctx, cli, img)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tag, imagectl.Repository+":") {
		t.Fatalf("tag %q", tag)
	}
	start := time.Now()
	again, err := imagectl.Ensure(ctx, cli, img)
	if err != nil || again != tag {
		t.Fatalf("second Ensure: %q, %v; want %q", again, err, tag)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("second Ensure took %v: it rebuilt an unchanged image", d)
	}
	out, err := exec.Command("docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", tag, "-c", "ls /usr/libexec/berth/berth-agent && echo sh-works").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "sh-works") {
		t.Fatalf("the image has no working /bin/sh or berth-agent: %v\n%s", err, out)
	}
}

func TestDynamicBinariesAreRefusedWithAHint(t *testing.T) {
	t.Parallel()
	dynamic, err := exec.LookPath("ls") // coreutils: dynamically linked on every Debian
	if err != nil {
		t.Fatalf("need a dynamically linked binary: %v", err)
	}
	var sb strings.Builder
	_, err = imagectl.AgentImage{AgentBinary: dynamic}.Context(&sb)
	if err == nil || !strings.Contains(err.Error(), "dynamically linked") || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Fatalf("Context with a dynamic berth-agent: %v", err)
	}
}
