package agent_test

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/agent/confine"
	"github.com/berth-dev/berth/internal/agentproto"
)

func TestTheAgentAndItsToolsHoldTheRequestsRlimits(t *testing.T) {
	t.Parallel()
	requireLandlock(t, confine.MinNetworkABI)
	f := newFixture(t)
	// dash's ulimit: -c core blocks, -t CPU seconds, -d data KiB, -p processes.
	req := f.request("/sh for o in c t d p; do echo \"$o $(ulimit -S$o) $(ulimit -H$o)\"; done")
	req.Rlimits = []agentproto.Rlimit{{Name: "core", Value: 0}, {Name: "cpu", Value: 90}, {Name: "data", Value: 300 << 20}, {Name: "nproc", Value: 4000}}
	res := runAgent(t, req)
	res.expect(t, agentproto.ExitOK)
	for _, want := range []string{"c 0 0\n", "t 90 90\n", "d 307200 307200\n", "p 4000 4000\n"} {
		if !strings.Contains(res.resp.Reply, want) {
			t.Errorf("a tool's limits lack %q (soft and hard):\n%s", want, res.resp.Reply)
		}
	}
}

func TestAnRlimitTheAgentDoesNotKnowFailsTheRunClosed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, rl := range []agentproto.Rlimit{{Name: "stack", Value: 1}, {Name: "bogus", Value: 1}} {
		req := f.request("/sh echo this must not run")
		req.Rlimits = []agentproto.Rlimit{rl}
		res := runAgent(t, req)
		res.expect(t, agentproto.ExitConfinement)
		if res.stdout != "" || !strings.Contains(res.stderr, `cannot set rlimit \"`+rl.Name+`\": unknown`) {
			t.Errorf("rlimit %q: stdout %q, stderr %q; want no response and the reason", rl.Name, res.stdout, res.stderr)
		}
	}
}
