package scheduler

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
)

// uidConfig is testConfig with agents alpha and beta, no workspace quota
// (these tests are about users, not quotas), and agent_uids r.
func uidConfig(r config.UIDRange) *config.Config {
	cfg := testConfig(4)
	cfg.Agents = []config.AgentSettings{{ID: "alpha", WorkspaceQuota: new(config.Bytes)}, {ID: "beta", WorkspaceQuota: new(config.Bytes)}}
	cfg.Scheduler.AgentUIDs = r
	return cfg
}

// runUserOf runs one message of agent through s and returns the user its
// plan names, once the run is in the backend.
func runUserOf(t *testing.T, s *Service, b *gateBackend, msgID, agent string) *isolation.RunUser {
	t.Helper()
	id := submit(t, s, msgID, agent)
	r := b.next(t)
	if r.spec.RunID != id {
		t.Fatalf("run %s started, want %s", r.spec.RunID, id)
	}
	r.reply("ok")
	waitState(t, s, id, StateSucceeded)
	if r.spec.User == nil {
		t.Fatalf("run of %s has no run user", agent)
	}
	return r.spec.User
}

func ownerOf(t *testing.T, path string) (uid, gid uint32) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid
}

func TestEachAgentRunsAsItsOwnUIDWhichSurvivesARestart(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	r := config.DefaultAgentUIDs
	dir := t.TempDir()
	first := map[string]uint32{}
	for round := range 2 {
		b := newGateBackend("landlock")
		s := newTestService(t, uidConfig(r), dir, b, nil)
		stop := start(t, s)
		// The second time in the other order: lowest-free allocation
		// without a record would swap their uids.
		agents := []string{"alpha", "beta"}
		if round == 1 {
			agents = []string{"beta", "alpha"}
		}
		for _, agent := range agents {
			u := runUserOf(t, s, b, agent+string(rune('0'+round)), agent)
			if u.UID < r.First || u.UID > r.Last || u.GID != u.UID {
				t.Fatalf("%s runs as uid %d gid %d, want one id of agent_uids %s", agent, u.UID, u.GID, r)
			}
			if uid, gid := ownerOf(t, filepath.Join(dir, "agents", agent)); uid != u.UID || gid != u.GID {
				t.Fatalf("%s's workspace is owned by %d:%d, want its run user %d:%d", agent, uid, gid, u.UID, u.GID)
			}
			if round == 0 {
				first[agent] = u.UID
			} else if u.UID != first[agent] {
				t.Fatalf("after a restart %s runs as uid %d, before as %d: want the same", agent, u.UID, first[agent])
			}
		}
		if first["alpha"] == first["beta"] {
			t.Fatalf("alpha and beta share uid %d", first["alpha"])
		}
		stop()
		s.Close()
	}
}

func TestARemovedAgentKeepsItsUID(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	b := newGateBackend("landlock")
	cfg := uidConfig(config.DefaultAgentUIDs)
	s := newTestService(t, cfg, "", b, nil)
	start(t, s)
	alpha := runUserOf(t, s, b, "m1", "alpha")
	// alpha is removed, gamma added: gamma must not get alpha's uid (alpha's
	// workspace is still on disk, owned by it).
	next := uidConfig(config.DefaultAgentUIDs)
	next.Agents = []config.AgentSettings{{ID: "beta", WorkspaceQuota: new(config.Bytes)}, {ID: "gamma", WorkspaceQuota: new(config.Bytes)}}
	s.Reload(next)
	gamma := runUserOf(t, s, b, "m2", "gamma")
	if gamma.UID == alpha.UID {
		t.Fatalf("gamma got uid %d of the removed agent alpha", gamma.UID)
	}
	s.Reload(cfg)
	if again := runUserOf(t, s, b, "m3", "alpha"); again.UID != alpha.UID {
		t.Fatalf("alpha, configured again, runs as %d, before as %d", again.UID, alpha.UID)
	}
}

func TestAgentUIDsOffRunsEveryAgentAsRunAs(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	b := newGateBackend("landlock")
	s := newTestService(t, uidConfig(config.UIDRange{Off: true}), "", b, nil)
	start(t, s)
	for i, agent := range []string{"alpha", "beta"} {
		u := runUserOf(t, s, b, "m"+string(rune('0'+i)), agent)
		if u.Name != "nobody" || u.UID != 65534 {
			t.Fatalf("%s runs as %+v, want run_as nobody", agent, u)
		}
	}
}

func TestAnExhaustedUIDRangeFailsTheRunNamingAgentUIDs(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	b := newGateBackend("landlock")
	one := config.UIDRange{First: config.DefaultAgentUIDs.First + 77, Last: config.DefaultAgentUIDs.First + 77}
	s := newTestService(t, uidConfig(one), "", b, nil)
	start(t, s)
	if u := runUserOf(t, s, b, "m1", "alpha"); u.UID != one.First {
		t.Fatalf("alpha runs as %d, want the range's only uid %d", u.UID, one.First)
	}
	id := submit(t, s, "m2", "beta")
	r := waitState(t, s, id, StateFailed)
	if r.Reason != isolation.ReasonStart || !strings.Contains(r.Error, "agent_uids") || !strings.Contains(r.Error, "no free uid for agent beta") {
		t.Fatalf("run = reason %q error %q; want a start failure naming agent_uids", r.Reason, r.Error)
	}
	if _, err := os.Stat(filepath.Join(s.stateDir, "agents", "beta")); !os.IsNotExist(err) {
		t.Fatalf("beta's workspace exists (err %v): a refused run must change nothing", err)
	}
}

func TestAWorkspaceOwnedBySomeoneElseIsHandedToTheAgent(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	dir := t.TempDir()
	ws := filepath.Join(dir, "agents", "alpha")
	// Left by a scheduler that ran every agent as nobody.
	for _, d := range []string{ws, filepath.Join(ws, "notes")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	outside := filepath.Join(dir, "outside")
	for _, f := range []string{filepath.Join(ws, "notes", "a.txt"), outside} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(outside, filepath.Join(ws, "hardlink")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{ws, filepath.Join(ws, "notes"), filepath.Join(ws, "notes", "a.txt"), filepath.Join(ws, "link")} {
		if err := os.Lchown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	b := newGateBackend("landlock")
	s := newTestService(t, uidConfig(config.DefaultAgentUIDs), dir, b, nil)
	start(t, s)
	u := runUserOf(t, s, b, "m1", "alpha")
	for _, p := range []string{ws, filepath.Join(ws, "notes"), filepath.Join(ws, "notes", "a.txt"), filepath.Join(ws, "link")} {
		if uid, gid := ownerOf(t, p); uid != u.UID || gid != u.GID {
			t.Errorf("%s is owned by %d:%d, want the agent's %d:%d", p, uid, gid, u.UID, u.GID)
		}
	}
	// Neither a symbolic link's target nor a file linked from elsewhere
	// changes hands.
	if uid, _ := ownerOf(t, outside); uid != 0 {
		t.Errorf("%s outside the workspace is owned by %d now, want root still", outside, uid)
	}
}

func TestAConfiguredWorkspaceTheAgentCannotWriteFailsTheRunClearly(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	ws := filepath.Join(t.TempDir(), "admin-made")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := uidConfig(config.DefaultAgentUIDs)
	cfg.Agents[0].Workspace = ws
	b := newGateBackend("landlock")
	s := newTestService(t, cfg, "", b, nil)

	e, err := s.ExplainAgent("alpha")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(e.Problems, "\n"), "cannot write it") {
		t.Fatalf("explain problems %q: want the unwritable workspace named", e.Problems)
	}

	start(t, s)
	id := submit(t, s, "m1", "alpha")
	r := waitState(t, s, id, StateFailed)
	if r.Reason != isolation.ReasonStart || !strings.Contains(r.Error, ws) || !strings.Contains(r.Error, "cannot write it") || !strings.Contains(r.Error, "chown -R") {
		t.Fatalf("run = reason %q error %q; want a start failure that names the workspace and the fix", r.Reason, r.Error)
	}
	if uid, _ := ownerOf(t, ws); uid != 0 {
		t.Fatalf("the admin's workspace is owned by %d now; berth must leave it as it is", uid)
	}
}

func TestExplainShowsTheUIDTheAgentRunsAs(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	b := newGateBackend("landlock")
	s := newTestService(t, uidConfig(config.DefaultAgentUIDs), "", b, nil)
	e, err := s.ExplainAgent("beta")
	if err != nil {
		t.Fatal(err)
	}
	if e.Plan.User == nil || !strings.Contains(e.Why["user"], "allocated from [scheduler] agent_uids") {
		t.Fatalf("explained user %+v why %q: want the agent's own uid", e.Plan.User, e.Why["user"])
	}
	start(t, s)
	if u := runUserOf(t, s, b, "m1", "beta"); u.UID != e.Plan.User.UID {
		t.Fatalf("beta runs as %d, explain said %d", u.UID, e.Plan.User.UID)
	}
	if _, err := s.ExplainAgent("nobody-configured"); err == nil {
		t.Fatal("explaining an unknown agent succeeded")
	}
}
