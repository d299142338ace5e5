package scheduler

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/landlock"
)

var (
	quotaAgentOnce sync.Once
	quotaAgentPath string
	quotaAgentErr  error
)

// quotaAgent builds testdata/quotaagent next to the host runner's test
// agent (a directory every user can enter).
func quotaAgent(t *testing.T) string {
	t.Helper()
	dir := filepath.Dir(testAgent(t))
	quotaAgentOnce.Do(func() {
		quotaAgentPath, quotaAgentErr = testenv.Build(dir, "quotaagent", "./testdata/quotaagent")
	})
	if quotaAgentErr != nil {
		t.Fatalf("cannot build quota agent: %v", quotaAgentErr)
	}
	return quotaAgentPath
}

// quotaService is a scheduler with the real landlock backend whose agent
// alpha has workspace_quota quota; refusal, when set, is why it cannot
// enforce quotas.
func quotaService(t *testing.T, quota string, refusal error) (*Service, string) {
	t.Helper()
	return quotaServiceWith(t, quota, refusal, nil)
}

// quotaServiceWith is quotaService whose config with changes first.
func quotaServiceWith(t *testing.T, quota string, refusal error, with func(*config.Config)) (*Service, string) {
	t.Helper()
	testenv.NeedRoot(t)
	_, err := os.Stat("/dev/loop-control")
	testenv.Need(t, err == nil, "no loop devices")
	stateDir := sharedStateDir(t)
	cfg := testConfig(4)
	cfg.Scheduler.AgentBinary = quotaAgent(t)
	cfg.Scheduler.AgentUIDs = config.DefaultAgentUIDs
	cfg.Scheduler.AllowRlimitFallback = true
	var q config.Bytes
	if err := q.UnmarshalText([]byte(quota)); err != nil {
		t.Fatal(err)
	}
	cfg.Agents[0].WorkspaceQuota = &q
	if with != nil {
		with(cfg)
	}
	s, err := New(cfg, stateDir, Options{
		Backends: map[string]isolation.Backend{landlock.Name: landlock.New()},
		Getenv:   func(string) string { return "" },
		Logger:   quietLog,
		// Why this host cannot enforce quotas, when the test says so.
		quotaRefusal: refusal,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	t.Cleanup(func() {
		if err := s.prep.ReleaseWorkspaces(); err != nil {
			t.Errorf("ReleaseWorkspaces: %v", err)
		}
	})
	start(t, s)
	return s, filepath.Join(stateDir, "agents", "alpha")
}

func runText(t *testing.T, s *Service, msgID, text string) Run {
	t.Helper()
	return waitFinished(t, s, submit(t, s, msgID, "alpha", "text", text))
}

var wrote = regexp.MustCompile(`^wrote (\d+) MiB: (.*)$`)

func TestWorkspaceQuotaStopsWritesOfAHostRunAtTheLimit(t *testing.T) {
	t.Parallel()
	s, ws := quotaService(t, "32m", nil)
	if r := runText(t, s, "m1", "put keep written before"); r.State != StateSucceeded || r.Reply != "ok" {
		t.Fatalf("put: state %q reason %q reply %q error %q", r.State, r.Reason, r.Reply, r.Error)
	}
	r := runText(t, s, "m2", "fill big 64")
	if r.State != StateSucceeded {
		t.Fatalf("a run that filled its workspace ended %q (%s: %s); want it to end with its reply", r.State, r.Reason, r.Error)
	}
	m := wrote.FindStringSubmatch(r.Reply)
	if m == nil {
		t.Fatalf("reply = %q", r.Reply)
	}
	if n, _ := strconv.Atoi(m[1]); n >= 32 || !strings.Contains(m[2], "no space left on device") {
		t.Fatalf("the agent wrote %s MiB into a 32 MiB workspace and was told %q; want ENOSPC before 32 MiB", m[1], m[2])
	}
	var st unix.Statfs_t
	if err := unix.Statfs(ws, &st); err != nil || st.Type != unix.EXT4_SUPER_MAGIC {
		t.Fatalf("workspace filesystem type %#x (%v); want its ext4 image", st.Type, err)
	}
	// The scheduler still records runs, and the next run sees the files.
	if r := runText(t, s, "m3", "get keep"); r.State != StateSucceeded || r.Reply != "written before" {
		t.Fatalf("next run: state %q reason %q reply %q error %q", r.State, r.Reason, r.Reply, r.Error)
	}
}

func TestWorkspaceQuotaThatCannotBeEnforcedFailsTheRunClosed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		quota      string
		wantState  string
		wantReason string
		wantError  string
		wantMount  bool
	}{
		{"A_quota_that_cannot_be_mounted_fails_the_run", "32m", StateFailed, isolation.ReasonConfinement, "confinement failed: cannot enforce workspace_quota 32m on ", false},
		{"Quota_0_mounts_nothing_and_runs", "0", StateSucceeded, "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, ws := quotaService(t, tc.quota, errors.New("no loop devices"))
			r := runText(t, s, "m1", "put f x")
			if r.State != tc.wantState || r.Reason != tc.wantReason || !strings.Contains(r.Error, tc.wantError) {
				t.Fatalf("run = state %q reason %q error %q; want %q %q containing %q", r.State, r.Reason, r.Error, tc.wantState, tc.wantReason, tc.wantError)
			}
			var st, parent unix.Stat_t
			if err := unix.Stat(ws, &st); err != nil {
				t.Fatal(err)
			}
			if err := unix.Stat(filepath.Dir(ws), &parent); err != nil {
				t.Fatal(err)
			}
			if mounted := st.Dev != parent.Dev; mounted != tc.wantMount {
				t.Fatalf("workspace mounted = %v; want %v", mounted, tc.wantMount)
			}
			if tc.wantState == StateFailed {
				if !strings.HasSuffix(r.Error, ": no loop devices") {
					t.Fatalf("error %q does not say why", r.Error)
				}
				if entries, _ := os.ReadDir(ws); len(entries) != 0 {
					t.Fatalf("a run that failed closed wrote %v", entries)
				}
			}
		})
	}
}

func TestWorkspaceQuotaImageUnmountedBehindTheSchedulersBackIsMountedAgainForTheNextRun(t *testing.T) {
	t.Parallel()
	s, ws := quotaService(t, "32m", nil)
	if r := runText(t, s, "m1", "put keep written before"); r.State != StateSucceeded || r.Reply != "ok" {
		t.Fatalf("put: state %q reason %q reply %q error %q", r.State, r.Reason, r.Reply, r.Error)
	}
	// An admin (or a reboot's missing mount unit) takes the image away.
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := unix.Unmount(ws, 0)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			t.Fatalf("cannot unmount %s: %v", ws, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The next run must not write to the host's disk beneath the mount
	// point: its image is mounted again and the files are there.
	if r := runText(t, s, "m2", "get keep"); r.State != StateSucceeded || r.Reply != "written before" {
		t.Fatalf("the run after the unmount: state %q reason %q reply %q error %q; want the image mounted again", r.State, r.Reason, r.Reply, r.Error)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(ws, &st); err != nil || st.Type != unix.EXT4_SUPER_MAGIC {
		t.Fatalf("workspace filesystem type %#x (%v); want its ext4 image", st.Type, err)
	}
}

func TestWorkspaceQuotaImageOfAnAgentRemovedWithItIsUnmountedAtTheFirstRunAfterTheReload(t *testing.T) {
	t.Parallel()
	quotaForBeta := func(cfg *config.Config) { cfg.Agents[1].WorkspaceQuota = new(config.Bytes(32 << 20)) }
	s, ws := quotaServiceWith(t, "32m", nil, quotaForBeta)
	stateDir := filepath.Dir(filepath.Dir(ws))
	wsBeta := filepath.Join(stateDir, "agents", "beta")
	for _, agent := range []string{"alpha", "beta"} {
		if r := waitFinished(t, s, submit(t, s, "m-"+agent, agent, "text", "put keep x")); r.State != StateSucceeded {
			t.Fatalf("%s: state %q reason %q error %q", agent, r.State, r.Reason, r.Error)
		}
	}
	if !mountedAt(t, wsBeta) {
		t.Fatal("beta's workspace image is not mounted after its run")
	}
	// The admin removes beta, and its image with it.
	if err := os.Remove(filepath.Join(stateDir, "workspaces", "beta.img")); err != nil {
		t.Fatal(err)
	}
	cfg := *s.cfg.Load()
	cfg.Agents = slices.DeleteFunc(slices.Clone(cfg.Agents), func(a config.AgentSettings) bool { return a.ID == "beta" })
	s.Reload(&cfg)
	if r := runText(t, s, "m2", "get keep"); r.State != StateSucceeded || r.Reply != "x" {
		t.Fatalf("alpha after the reload: state %q reason %q reply %q error %q", r.State, r.Reason, r.Reply, r.Error)
	}
	if mountedAt(t, wsBeta) {
		t.Fatal("the deleted image of the removed agent is still mounted: it holds its reserved space")
	}
}

// mountedAt says whether a filesystem of its own is mounted at dir.
func mountedAt(t *testing.T, dir string) bool {
	t.Helper()
	var st, parent unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Dir(dir), &parent); err != nil {
		t.Fatal(err)
	}
	return st.Dev != parent.Dev
}
