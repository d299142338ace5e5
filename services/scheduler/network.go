package scheduler

import (
	"fmt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

// ReasonProviderNeedsNetwork fails a run whose model is reached over the
// network while the agent has none (docs/adr/0004-providers-need-network.md).
const ReasonProviderNeedsNetwork = "provider needs network"

// agentHasNetwork says whether the agent's sandbox can open TCP connections:
// container_mode.network for containers, file_access.allow_network otherwise.
func agentHasNetwork(a config.Agent) bool {
	if a.Isolation == "container" {
		return a.Container.Network != "none"
	}
	return a.FileAccess.AllowNetwork
}

// checkProviderNetwork fails closed, before anything starts, when a provider
// of the agent's chain needs the network and the agent's sandbox has none:
// the run would otherwise spend its retries on connection errors. Only the
// "local" provider works offline; a base_url on 127.0.0.1 is no exception,
// since a cut-off agent has its own empty network namespace.
func checkProviderNetwork(a config.Agent, chain []agentproto.Provider) error {
	if agentHasNetwork(a) {
		return nil
	}
	for _, p := range chain {
		if p.Kind == "local" {
			continue
		}
		setting := fmt.Sprintf("set file_access.allow_network = true for agent %q", a.ID)
		if a.Isolation == "container" {
			setting = fmt.Sprintf("set container_mode.network = \"bridge\" for agent %q", a.ID)
		}
		return isolation.Errorf(ReasonProviderNeedsNetwork,
			"agent %q uses provider %q (%s), which is reached over the network, but the agent has no network access: %s, or use provider \"local\"",
			a.ID, p.Name, p.Kind, setting)
	}
	return nil
}
