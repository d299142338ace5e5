package scheduler

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

// fakeImages answers EnsureIsolationImageWith as berth-imaged would.
type fakeImages struct {
	mu    sync.Mutex
	asked []string
	tag   string
	err   error
}

func (f *fakeImages) EnsureIsolationImageWith(_ context.Context, agent string, _ busapi.EnsureOptions) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, agent)
	return f.tag, f.err
}

func containerConfig(t *testing.T, image string) *config.Config {
	t.Helper()
	text := "[scheduler]\nrun_as = \"nobody\"\n\n[[agents]]\nid = \"boxed\"\n[agents.container_mode]\nenabled = true\n"
	if image != "" {
		text += "image = \"" + image + "\"\n"
	}
	path := filepath.Join(t.TempDir(), "berth.toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

func TestContainerRunsGetTheirImageFromTheImageService(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		configured string // container_mode.image
		images     *fakeImages
		wantImage  string // in the plan the backend gets; "" means no run starts
		wantReason string
		wantAsked  int
	}{
		{"The_image_service_names_the_isolation_image", "", &fakeImages{tag: "berth-isolated:1.0.0-abc"}, "berth-isolated:1.0.0-abc", "", 1},
		{"A_failed_build_fails_the_run_with_its_step", "", &fakeImages{err: errors.New("step 3/5 RUN dpkg -i: jq not found")}, "", isolation.ReasonImageBuildFailed, 1},
		{"A_configured_image_is_used_as_it_is", "my-agent:1", &fakeImages{tag: "never"}, "my-agent:1", "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newGateBackend("container")
			s := newTestService(t, containerConfig(t, tc.configured), "", b, nil, func(o *Options) {
				o.Backends = map[string]isolation.Backend{"container": b}
				o.Images = tc.images
			})
			start(t, s)
			id := submit(t, s, "m1", "boxed")
			if tc.wantImage != "" {
				select {
				case run := <-b.started:
					if got := run.spec.Plan.Container.Image; got != tc.wantImage {
						t.Errorf("the backend got image %q, want %q", got, tc.wantImage)
					}
					run.finish <- outcome{res: isolation.Result{}}
				case <-time.After(30 * time.Second):
					t.Fatal("the run never reached the backend")
				}
			} else {
				r := waitState(t, s, id, StateFailed)
				if r.Reason != tc.wantReason || !strings.Contains(r.Error, "jq not found") {
					t.Errorf("run failed with reason %q, error %q; want %q naming the failing step", r.Reason, r.Error, tc.wantReason)
				}
				if len(b.started) != 0 {
					t.Error("a run whose image could not be built reached the backend")
				}
			}
			tc.images.mu.Lock()
			defer tc.images.mu.Unlock()
			if len(tc.images.asked) != tc.wantAsked {
				t.Errorf("berth-imaged was asked %d times, want %d", len(tc.images.asked), tc.wantAsked)
			}
		})
	}
}
