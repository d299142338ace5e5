package runprep

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/internal/testkit/testenv"
	"github.com/berth-dev/berth/isolation"
)

// agent_uids is defaulted once, where a Config is resolved; a range that
// reaches the allocator empty (a Config made in code without
// config.Defaults) or that agent_uids could not hold is refused, so no
// agent is ever handed uid 0 or a system account's uid.
func TestAnAgentUIDRangeAgentUIDsCouldNotHoldIsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		r    config.UIDRange
		want string
	}{
		{"Error_when_the_range_is_empty", config.UIDRange{}, "cannot allocate a uid for agent a: [scheduler] agent_uids is empty"},
		{"Error_when_the_range_holds_root", config.UIDRange{First: 0, Last: 5}, "starts below 1000"},
		{"Error_when_the_range_holds_nobody", config.UIDRange{First: 60000, Last: 70000}, "includes 65534 (nobody)"},
		{"Error_when_agent_uids_is_off", config.UIDRange{Off: true}, `agent_uids is "off"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := uidDB(t)
			p := New(Options{StateDir: t.TempDir(), UIDs: db, Logger: quietLog})
			uid, err := p.agentUID("a", tc.r)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("agentUID from %+v = %d, %v; want an error saying %q", tc.r, uid, err, tc.want)
			}
			if held := storedUIDs(t, db); len(held) != 0 {
				t.Errorf("a refused range still recorded uids %v", held)
			}
		})
	}
}

// Through Facts, as the scheduler asks: the run of an agent whose Config has
// no agent_uids range is refused before it starts, never run as root.
func TestARunWithAnEmptyAgentUIDRangeIsRefusedNeverRunAsRoot(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t)
	cfg := &config.Config{Agents: []config.AgentSettings{{ID: "a"}}, Scheduler: config.Scheduler{RunAs: "nobody", AgentBinary: "/bin/true"}}
	p := New(Options{StateDir: t.TempDir(), UIDs: uidDB(t), Logger: quietLog, Getenv: func(string) string { return "" }})
	host := p.Facts(cfg, "a")
	if host.RunUser != nil || host.RunUserErr == nil || !strings.Contains(host.RunUserErr.Error(), "agent_uids is empty") {
		t.Fatalf("Facts: run user %+v, error %v; want none, and the empty range named", host.RunUser, host.RunUserErr)
	}
	_, err := runplan.Compile(cfg, "a", "r1", host)
	if isolation.ReasonOf(err) != isolation.ReasonStart || !strings.Contains(err.Error(), "agent_uids is empty") {
		t.Errorf("Compile: %v (reason %q); want the run refused for the empty range", err, isolation.ReasonOf(err))
	}

	withDefaults := config.Defaults()
	withDefaults.Agents = cfg.Agents
	host = p.Facts(withDefaults, "a")
	if host.RunUserErr != nil || host.RunUser == nil || host.RunUser.UID < config.DefaultAgentUIDs.First || host.RunUser.UID > config.DefaultAgentUIDs.Last {
		t.Errorf("Facts of a Config from config.Defaults: run user %+v, %v; want a uid of %s", host.RunUser, host.RunUserErr, config.DefaultAgentUIDs)
	}
}
