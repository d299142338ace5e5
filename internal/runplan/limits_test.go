package runplan_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/container"
	"github.com/berth-dev/berth/isolation/hostrun"
	"github.com/berth-dev/berth/isolation/landlock"
	"github.com/berth-dev/berth/isolation/unrestricted"
)

const limitsConfig = `[[agents]]
id = "boxed"
provider = "local"
container_mode = { enabled = true, network = "none" }

[[agents]]
id = "host"
provider = "local"

[[agents]]
id = "ops"
provider = "local"
file_access.unrestricted = true

[scheduler]
run_as = "nobody"
# Where this host has no writable cgroup, Explain shows the rlimit instead.
allow_rlimit_fallback = true
`

func loadLimitsConfig(t *testing.T) *config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "berth.toml")
	if err := os.WriteFile(path, []byte(limitsConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return cfg
}

// holdsOne says whether a line of holds contains one of wants.
func holdsOne(holds []string, wants ...string) bool {
	return slices.ContainsFunc(holds, func(h string) bool {
		return slices.ContainsFunc(wants, func(w string) bool { return strings.Contains(h, w) })
	})
}

// The processes, CPU and tmpfs of a run, which berth.toml has no key for,
// are defaulted once, by runplan; the backend shows (and gives) the plan's
// numbers, whatever they are, and has no numbers of its own.
func TestEveryLimitWalksFromThePlanToTheBackendOnce(t *testing.T) {
	t.Parallel()
	cfg := loadLimitsConfig(t)
	boxes, err := container.New(container.Options{Instance: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}

	boxed, err := runplan.Compile(cfg, "boxed", "r1", facts(t, nil))
	if err != nil {
		t.Fatalf("Compile boxed: %v", err)
	}
	if l := boxed.Limits; l.Pids != runplan.DefaultPids || l.NanoCPUs != runplan.DefaultNanoCPUs || l.TmpfsBytes != runplan.DefaultTmpfs {
		t.Errorf("container plan limits %+v, want runplan's defaults", l)
	}
	host, err := runplan.Compile(cfg, "host", "r2", facts(t, nil))
	if err != nil {
		t.Fatalf("Compile host: %v", err)
	}
	if l := host.Limits; l.Pids != runplan.DefaultPids || l.NanoCPUs != runplan.DefaultNanoCPUs || l.TmpfsBytes != 0 {
		t.Errorf("host plan limits %+v, want runplan's processes and CPU (a host run's scratch tmpfs is not the plan's)", l)
	}

	for _, tc := range []struct {
		name               string
		pids, cpus, tmpfs  int64
		pidsLine, cpusLine string
	}{
		{"the defaults", runplan.DefaultPids, runplan.DefaultNanoCPUs, runplan.DefaultTmpfs, "256", "1000000000"},
		{"numbers no backend defaults to", 77, 500_000_000, 64 << 20, "77", "500000000"},
	} {
		boxed.Limits.Pids, boxed.Limits.NanoCPUs, boxed.Limits.TmpfsBytes = tc.pids, tc.cpus, tc.tmpfs
		c := boxes.Explain(boxed)
		for _, want := range []string{"PidsLimit=" + tc.pidsLine, "NanoCPUs=" + tc.cpusLine, "tmpfs /tmp of " + isolation.FormatBytes(tc.tmpfs)} {
			if !slices.Contains(c.Holds, want) && !holdsOne(c.Holds, want) {
				t.Errorf("%s: container holds %q, want %q", tc.name, c.Holds, want)
			}
		}
		if len(c.Missing) > 0 && holdsOne(c.Missing, "refused") {
			t.Errorf("%s: container refuses the plan: %q", tc.name, c.Missing)
		}

		host.Limits.Pids, host.Limits.NanoCPUs = tc.pids, tc.cpus
		// TasksMax= of a unit, pids.max= of a cgroup, or RLIMIT_NPROC=, as
		// this host can hold it.
		h := hostrun.Runner{}.Explain(host)
		if !holdsOne(h.Holds, "TasksMax="+tc.pidsLine+" ", "pids.max="+tc.pidsLine, "RLIMIT_NPROC="+tc.pidsLine) {
			t.Errorf("%s: host run holds %q, want a process limit of %s", tc.name, h.Holds, tc.pidsLine)
		}
		if holdsOne(h.Missing, "refused") {
			t.Errorf("%s: host run refuses the plan: %q", tc.name, h.Missing)
		}
	}
}

// To an engine, a cgroup and the kernel's tmpfs a zero limit is no limit at
// all: a plan that lost one (built by hand, or by a bug) is refused by each
// backend before anything starts, with the limit named, and never run
// unbounded or with a default of the backend's own.
func TestAPlanWithoutAProcessCPUOrTmpfsLimitIsRefusedByEveryBackend(t *testing.T) {
	t.Parallel()
	cfg := loadLimitsConfig(t)
	// An engine that never answers: a plan that got past the check would
	// fail with engine-unavailable instead, not run.
	cli, err := client.New(client.WithHost(testdocker.HungEngine(t)), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	boxes, err := container.New(container.Options{Client: cli, Instance: t.TempDir(), EngineTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	backends := []struct {
		agent   string
		backend interface {
			isolation.Backend
			isolation.Keeper
			Explain(isolation.Plan) isolation.Confinement
		}
	}{
		{"boxed", boxes},
		{"host", landlock.New()},
		{"ops", unrestricted.New(slog.New(slog.DiscardHandler))},
	}
	limits := []struct {
		name      string
		zero      func(*isolation.Limits)
		says      string
		container bool // only a container's plan has the limit
	}{
		{"processes", func(l *isolation.Limits) { l.Pids = 0 }, "it has no process limit", false},
		{"CPU", func(l *isolation.Limits) { l.NanoCPUs = 0 }, "it has no CPU limit", false},
		{"tmpfs", func(l *isolation.Limits) { l.TmpfsBytes = 0 }, "it has no size for the container's /tmp tmpfs", true},
	}
	for _, b := range backends {
		for _, lim := range limits {
			if lim.container && b.agent != "boxed" {
				continue
			}
			t.Run(fmt.Sprintf("%s_without_%s", b.agent, lim.name), func(t *testing.T) {
				t.Parallel()
				p, err := runplan.Compile(cfg, b.agent, "r-"+b.agent+"-"+lim.name, facts(t, nil))
				if err != nil {
					t.Fatalf("Compile: %v", err)
				}
				// All a run needs but the limit, so that only the limit can
				// stop it.
				if err := os.MkdirAll(p.Workspace, 0o755); err != nil {
					t.Fatal(err)
				}
				p.AgentBinary = "/bin/true"
				lim.zero(&p.Limits)
				want := fmt.Sprintf("cannot run the plan of run %s (agent %s): %s", p.RunID, b.agent, lim.says)
				spec := isolation.Spec{Plan: p}
				_, err = b.backend.Run(context.Background(), spec)
				if isolation.ReasonOf(err) != isolation.ReasonStart || err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Run: %v (reason %q); want the plan refused: %q", err, isolation.ReasonOf(err), want)
				}
				kept, err := b.backend.Start(context.Background(), spec)
				if kept != nil {
					kept.Stop(context.Background(), time.Second)
				}
				if isolation.ReasonOf(err) != isolation.ReasonStart || err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Start: %v (reason %q); want the plan refused: %q", err, isolation.ReasonOf(err), want)
				}
				if c := b.backend.Explain(p); !holdsOne(c.Missing, "refused") {
					t.Errorf("Explain: missing %q; want the refusal named", c.Missing)
				}
			})
		}
	}
}
