package scheduler

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/isolation"
)

// ForceUnrestricted is an option, not an alias in the backend map: the
// compiled plan alone sends a landlock agent to the unrestricted backend and
// says why, and the landlock backend (still in the map) runs nothing.
func TestForceUnrestrictedCompilesLandlockAgentsAsUnrestrictedPlans(t *testing.T) {
	t.Parallel()
	cfg := testConfig(4)
	landlockBackend := newGateBackend(string(isolation.BackendLandlock))
	unrestrictedBackend := newGateBackend(string(isolation.BackendUnrestricted))
	s := newTestService(t, cfg, "", landlockBackend, nil, func(o *Options) {
		o.Backends[string(isolation.BackendUnrestricted)] = unrestrictedBackend
		o.ForceUnrestricted = true
	})

	e, err := s.ExplainAgent("alpha")
	if err != nil {
		t.Fatal(err)
	}
	if e.Plan.Backend != string(isolation.BackendUnrestricted) || !e.BackendAvailable {
		t.Fatalf("explained backend = %q (available %v), want %q", e.Plan.Backend, e.BackendAvailable, isolation.BackendUnrestricted)
	}
	if why := e.Why["backend"]; !strings.Contains(why, "--unrestricted") || !strings.Contains(why, "NO file confinement") {
		t.Errorf("why backend = %q, want it to name --unrestricted and the missing confinement", why)
	}

	id := submit(t, s, "m1", "alpha")
	start(t, s)
	run := unrestrictedBackend.next(t)
	if run.spec.Plan.Backend != isolation.BackendUnrestricted || !run.spec.Plan.Policy.Unrestricted {
		t.Errorf("run plan backend = %q, policy unrestricted = %v", run.spec.Plan.Backend, run.spec.Plan.Policy.Unrestricted)
	}
	run.finish <- outcome{res: isolation.Result{}}
	if r := waitState(t, s, id, StateSucceeded); r.Backend != string(isolation.BackendUnrestricted) {
		t.Errorf("run record backend = %q, want %q", r.Backend, isolation.BackendUnrestricted)
	}
	landlockBackend.none(t, s)
}
