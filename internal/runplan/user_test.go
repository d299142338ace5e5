package runplan_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

func TestThePlanSaysWhoTheAgentRunsAs(t *testing.T) {
	t.Parallel()
	own := runplan.AgentUserFor(config.DefaultAgentUIDs.First + 3)
	tests := []struct {
		name     string
		off      bool
		user     *isolation.RunUser
		agent    bool
		err      error
		wantUser *isolation.RunUser
		wantWhy  string
		problem  string
	}{
		{"An_agent_with_its_own_uid_runs_as_that_number", false, own, true, nil, own,
			"uid 1879048195, gid 1879048195, allocated from [scheduler] agent_uids (1879048192-1879113727) for this agent only", ""},
		{"With_agent_uids_off_every_agent_runs_as_run_as", true, &isolation.RunUser{Name: "nobody", UID: 65534, GID: 65534}, false, nil, &isolation.RunUser{Name: "nobody", UID: 65534, GID: 65534},
			`[scheduler] agent_uids = "off": every agent runs as this one user`, ""},
		{"A_uid_that_cannot_be_allocated_refuses_the_run", false, nil, true, errors.New("no free uid for agent ops in [scheduler] agent_uids"), nil,
			"cannot be had", "no free uid"},
		{"A_scheduler_that_is_not_root_runs_agents_as_itself", false, nil, false, nil, nil,
			"the scheduler's own user: it is not root", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var dropIns []string
			if tc.off {
				dropIns = append(dropIns, "[scheduler]\nagent_uids = \"off\"\n")
			}
			cfg := testConfig(t, dropIns...)
			host := facts(t, nil)
			host.RunUser, host.AgentUser, host.RunUserErr = tc.user, tc.agent, tc.err
			e, err := runplan.Explain(cfg, "free", host)
			if err != nil {
				t.Fatal(err)
			}
			if (e.Plan.User == nil) != (tc.wantUser == nil) || (e.Plan.User != nil && e.Plan.User.UID != tc.wantUser.UID) {
				t.Errorf("user %+v, want %+v", e.Plan.User, tc.wantUser)
			}
			if !strings.Contains(e.Why["user"], tc.wantWhy) {
				t.Errorf("why user %q, want it to say %q", e.Why["user"], tc.wantWhy)
			}
			got := strings.Join(e.Problems, "\n")
			if (tc.problem == "") != (got == "") || !strings.Contains(got, tc.problem) {
				t.Errorf("problems %q, want %q", got, tc.problem)
			}
			if tc.agent && tc.user != nil && e.Plan.RunAs != "1879048195" {
				t.Errorf("run_as %q, want the bare uid", e.Plan.RunAs)
			}
		})
	}
}

func TestAnAgentsOwnUserHasNoNameHomeOrOtherGroup(t *testing.T) {
	t.Parallel()
	u := runplan.AgentUserFor(1879048200)
	if u.Name != "1879048200" || u.UID != 1879048200 || u.GID != 1879048200 || u.Home != "" || len(u.Groups) != 1 || u.Groups[0] != u.GID {
		t.Fatalf("agent user %+v", u)
	}
}

func TestAConfiguredWorkspaceTheRunUserCannotWriteIsAProblem(t *testing.T) {
	t.Parallel()
	host := facts(t, nil)
	host.RunUser, host.AgentUser = runplan.AgentUserFor(1879048192), true
	host.WorkspaceErr = errors.New("workspace /srv/docs-ws cannot be written")
	if _, err := runplan.Compile(testConfig(t), "docs", "r1", host); isolation.ReasonOf(err) != isolation.ReasonStart || !strings.Contains(err.Error(), "/srv/docs-ws") {
		t.Fatalf("Compile = %v, want the run refused naming the workspace", err)
	}
}
