package images_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/services/images"
)

// copyAgent copies the test's berth-agent to a file of the test's own.
func copyAgent(t *testing.T) string {
	t.Helper()
	src, err := os.Open(agentBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst := filepath.Join(t.TempDir(), "berth-agent")
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, src); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestARebuiltAgentBinaryGetsItsOwnIsolationImageAtTheNextRun(t *testing.T) {
	t.Parallel()
	needBusybox(t)
	agent := copyAgent(t)
	path := filepath.Join(t.TempDir(), "berth.toml")
	if err := os.WriteFile(path, fmt.Appendf(nil, "[scheduler]\nagent_binary = %q\n\n[[agents]]\nid = \"ops\"\n[agents.container_mode]\nenabled = true\n", agent), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	f := newService(t, cfg)
	first := ensure(t, f, "ops")
	f.removeImagesAtEnd(t, first)
	before := f.svc.BuildsStarted()
	if again := ensure(t, f, "ops"); again != first || f.svc.BuildsStarted() != before {
		t.Fatalf("asked again for the same binary: %q after %d builds, want %q and none", again, f.svc.BuildsStarted()-before, first)
	}
	// A new build of the agent in place, its mtime set back to the old
	// one's, must not be taken for the one already hashed.
	fi, err := os.Stat(agent)
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(agent, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := out.Write([]byte("rebuilt!")); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(agent, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	rebuilt := ensure(t, f, "ops")
	f.removeImagesAtEnd(t, rebuilt)
	if rebuilt == first {
		t.Fatalf("the changed agent binary got the old isolation image %s", first)
	}
}

func TestAnImagesLastUseIsWrittenAtMostOnceAMinute(t *testing.T) {
	t.Parallel()
	needBusybox(t)
	cfg, _ := writeConfig(t, "[[agents]]\nid = \"ops\"\n[agents.container_mode]\nenabled = true\n")
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	f := newServiceWith(t, cfg, images.Options{Clock: clock})
	lastUsed := func(tag string) time.Time {
		t.Helper()
		list, err := f.svc.ListImages(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, img := range list {
			if img.Tag == tag {
				return img.LastUsed
			}
		}
		t.Fatalf("%s is not listed", tag)
		return time.Time{}
	}
	tag := ensure(t, f, "ops")
	first := lastUsed(tag)
	if first.IsZero() {
		t.Fatalf("%s has no last use after a run asked for it", tag)
	}
	clock.Advance(30 * time.Second)
	ensure(t, f, "ops")
	if got := lastUsed(tag); !got.Equal(first) {
		t.Fatalf("last use %s after a use 30 s later, want it unchanged at %s", got, first)
	}
	clock.Advance(31 * time.Second)
	ensure(t, f, "ops")
	if got, want := lastUsed(tag), first.Add(61*time.Second); !got.Equal(want) {
		t.Fatalf("last use %s after a use 61 s later, want %s", got, want)
	}
}
