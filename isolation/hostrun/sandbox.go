package hostrun

import "github.com/berth-dev/berth/isolation"

// sandboxHolds says which namespaces and filters confine a plan's host run
// beyond its limits (for Explain); unit says the run is a transient unit.
func sandboxHolds(p isolation.Plan, unit bool) (holds, missing []string) {
	return nil, nil
}
