package images_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/services/images"
)

func TestDefaultIsolationImageRunsBerthAgentAsNonRootInWorkspace(t *testing.T) {
	t.Parallel()
	needBusybox(t)
	cfg, _ := writeConfig(t, "[[agents]]\nid = \"ops\"\n[agents.container_mode]\nenabled = true\n")
	f := newService(t, cfg)
	tag := ensure(t, f, "ops")
	if !strings.HasPrefix(tag, "berth-isolated:1.2.3_test-") {
		t.Fatalf("tag %q, want berth-isolated:<version>-<hash>", tag)
	}
	ctx := context.Background()
	img, err := f.cli.ImageInspect(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	c := img.Config
	v, err := f.cli.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		what string
		ok   bool
	}{
		{"user is non-root (" + c.User + ")", c.User == imagectl.RunUser},
		{"workdir is /workspace (" + c.WorkingDir + ")", c.WorkingDir == "/workspace"},
		{"HOME=/workspace", slices.Contains(c.Env, "HOME=/workspace")},
		{"TMPDIR=/tmp", slices.Contains(c.Env, "TMPDIR=/tmp")},
		{"entrypoint is berth-agent", slices.Equal(c.Entrypoint, []string{imagectl.AgentBinaryPath})},
		{"architecture is the engine's (" + img.Architecture + ")", imagectl.NormalizeArch(img.Architecture) == imagectl.NormalizeArch(v.Arch)},
	}
	for _, ch := range checks {
		if !ch.ok {
			t.Errorf("isolation image %s: want %s", tag, ch.what)
		}
	}
	out, err := exec.Command("docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", tag, "-c", "id -u; pwd; echo $HOME").CombinedOutput()
	if err != nil || strings.Fields(string(out))[0] != "65534" || !strings.Contains(string(out), "/workspace") {
		t.Fatalf("a container of %s says %q (%v), want uid 65534 in /workspace", tag, out, err)
	}

	// Asked again, nothing is built: the same tag comes back.
	before := f.svc.BuildsStarted()
	if again := ensure(t, f, "ops"); again != tag || f.svc.BuildsStarted() != before {
		t.Fatalf("second EnsureIsolationImage: %q after %d new builds, want %q and none", again, f.svc.BuildsStarted()-before, tag)
	}
}

func TestConcurrentEnsureCallsForOneImageShareOneBuild(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	needBase(t, cli)
	cfg, _ := writeConfig(t, fmt.Sprintf("[[agents]]\nid = \"ops\"\n[agents.container_mode]\nenabled = true\n[agents.image_config]\nenabled = true\nenv_vars = { RUN_NONCE = %q }\n", nonce()))
	f := newService(t, cfg)
	const callers = 8
	tags := make([]string, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			tags[i], errs[i] = f.svc.EnsureIsolationImage(ctx, "ops")
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	f.removeImagesAtEnd(t, tags[0])
	for _, tag := range tags {
		if tag != tags[0] {
			t.Fatalf("callers got different tags: %v", tags)
		}
	}
	if n := f.svc.BuildsStarted(); n != 1 {
		t.Fatalf("%d concurrent EnsureIsolationImage calls started %d builds, want 1", callers, n)
	}
}

func TestImageRemovedBehindBerthsBackIsShownMissingAndRebuiltOnNextUse(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	needBase(t, cli)
	cfg, _ := writeConfig(t, fmt.Sprintf("[[agents]]\nid = \"ops\"\n[agents.container_mode]\nenabled = true\n[agents.image_config]\nenabled = true\nenv_vars = { RUN_NONCE = %q }\n", nonce()))
	f := newService(t, cfg)
	tag := ensure(t, f, "ops")
	f.removeImagesAtEnd(t, tag)
	ctx := context.Background()
	if _, err := f.cli.ImageRemove(ctx, tag, client.ImageRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	list, err := f.svc.ListImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(list, func(img images.Image) bool { return img.Tag == tag })
	if i < 0 || list[i].Present {
		t.Fatalf("ListImages after docker rmi: %+v, want %s listed as missing", list, tag)
	}
	if !slices.Contains(list[i].Agents, "ops") {
		t.Fatalf("ListImages does not say agent ops uses %s: %+v", tag, list[i])
	}
	if again := ensure(t, f, "ops"); again != tag || !f.present(t, tag) {
		t.Fatalf("EnsureIsolationImage after the removal: %q, present %v; want %s rebuilt", again, f.present(t, tag), tag)
	}
}

func TestPackagesTheHostsAptDoesNotKnowFailTheBuildNamingThem(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	needBase(t, cli)
	testenvNeedApt(t)
	cfg, _ := writeConfig(t, "[[agents]]\nid = \"ops\"\n[agents.container_mode]\nenabled = true\n[agents.image_config]\nenabled = true\npackages = [\"berth-no-such-package\"]\n")
	f := newService(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := f.svc.EnsureIsolationImage(ctx, "ops")
	if err == nil || !strings.Contains(err.Error(), "Unable to locate package berth-no-such-package") {
		t.Fatalf("EnsureIsolationImage error = %v, want it to name the unknown package", err)
	}
	list, lerr := f.svc.ListImages(ctx)
	if lerr != nil {
		t.Fatal(lerr)
	}
	i := slices.IndexFunc(list, func(img images.Image) bool { return img.Kind == imagectl.KindSandbox })
	if i < 0 || list[i].Status != images.StatusFailed || !strings.Contains(list[i].Error, "berth-no-such-package") {
		t.Fatalf("the failed container image is not recorded as failed with its error: %+v", list)
	}
}

func TestBaseImageMissingNamesTheScriptThatBuildsIt(t *testing.T) {
	t.Parallel()
	cfg, _ := writeConfig(t, "[[agents]]\nid = \"ops\"\n[agents.image_config]\nenabled = true\nbase_image = \"berth-base:bookworm\"\n")
	f := newService(t, cfg)
	ctx := context.Background()
	if _, err := f.cli.ImageInspect(ctx, "berth-base:bookworm"); err == nil {
		// Present here: point at a name that surely is not.
		cfg, _ = writeConfig(t, "[[agents]]\nid = \"ops\"\n[agents.image_config]\nenabled = true\nbase_image = \"berth-base:no-such-"+nonce()+"\"\n")
		f = newService(t, cfg)
	}
	_, err := f.svc.Dockerfile(ctx, "ops")
	if err == nil || !strings.Contains(err.Error(), "scripts/base-image.sh") || !errors.Is(err, images.ErrNotFound) {
		t.Fatalf("Dockerfile with a missing base: %v, want a not-found error naming scripts/base-image.sh", err)
	}
}

func TestCleanKeepsImagesAnAgentReferencesOrAContainerUses(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	needBase(t, cli)
	agents := ""
	for _, id := range []string{"kept", "gone", "used"} {
		agents += fmt.Sprintf("[[agents]]\nid = %q\n[agents.container_mode]\nenabled = true\n[agents.image_config]\nenabled = true\nenv_vars = { RUN_NONCE = %q }\n", id, nonce())
	}
	cfg, path := writeConfig(t, agents)
	f := newService(t, cfg)
	kept, gone, used := ensure(t, f, "kept"), ensure(t, f, "gone"), ensure(t, f, "used")
	f.removeImagesAtEnd(t, kept, gone, used)
	ctx := context.Background()
	c, err := f.cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{Image: used, Cmd: []string{"/bin/true"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = f.cli.ContainerRemove(context.Background(), c.ID, client.ContainerRemoveOptions{Force: true})
	})

	// Only "kept" stays configured.
	reduced, _ := writeConfigAt(t, path, fmt.Sprintf("[[agents]]\nid = \"kept\"\n[agents.container_mode]\nenabled = true\n[agents.image_config]\nenabled = true\nenv_vars = { RUN_NONCE = %q }\n", envOf(t, cfg, "kept")))
	f.svc.Reload(reduced)

	removed, err := f.svc.Clean(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, gone) || slices.Contains(removed, kept) || slices.Contains(removed, used) {
		t.Fatalf("Clean(false) removed %v; want %s gone, %s (referenced) and %s (in use) kept", removed, gone, kept, used)
	}
	if f.present(t, gone) || !f.present(t, kept) || !f.present(t, used) {
		t.Fatalf("after Clean(false): gone present %v, kept present %v, used present %v", f.present(t, gone), f.present(t, kept), f.present(t, used))
	}
	removed, err = f.svc.Clean(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, kept) || slices.Contains(removed, used) || f.present(t, kept) || !f.present(t, used) {
		t.Fatalf("Clean(true) removed %v; want %s removed and %s (in use) kept", removed, kept, used)
	}
}

func TestImageForAnotherArchitectureIsRefusedNamingBoth(t *testing.T) {
	t.Parallel()
	cli := testdocker.Engine(t)
	foreign := testdocker.ForeignImage(t, cli, "arm64")
	if imagectl.NormalizeArch(engineArch(t, cli)) == "arm64" {
		foreign = testdocker.ForeignImage(t, cli, "amd64")
	}
	cfg, _ := writeConfig(t, fmt.Sprintf("[[agents]]\nid = \"ops\"\n[agents.image_config]\nenabled = true\nimage = %q\n", foreign))
	f := newService(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := f.svc.EnsureIsolationImage(ctx, "ops")
	want := imagectl.NormalizeArch(engineArch(t, cli))
	if err == nil || !strings.Contains(err.Error(), "is built for") || !strings.Contains(err.Error(), "the engine runs "+want) {
		t.Fatalf("EnsureIsolationImage on %s: %v, want an error naming both architectures", foreign, err)
	}
}
