package scheduler

import (
	"fmt"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/runplan"
	"github.com/berth-dev/berth/isolation"
)

// explainGit answers ExplainEgress's git question (busapi.GitMethod) with
// the git rules the agent's next run would hand its proxy, judged by the
// proxy's own code.
func explainGit(e runplan.Explanation, agent, method, op, remote, ref string) (busapi.EgressVerdict, error) {
	v, err := e.Plan.Egress.DecideGit(op, remote, ref)
	if err != nil {
		return busapi.EgressVerdict{}, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	v.Method, v.URL = method, remote
	out := busVerdict(v, agent, e.Plan.Network.Mode)
	if e.Plan.Network.Allowed || e.Plan.Backend == isolation.BackendUnrestricted {
		out.Allowed, out.Direct, out.Rule, out.Note = true, true, "", ""
		out.Reason = "not filtered: the sandbox has a direct network, so git reaches the remote without the egress proxy and its git rules; network: " + e.Why["network"]
	}
	return out, nil
}
