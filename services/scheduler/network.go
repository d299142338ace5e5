package scheduler

import "github.com/berth-dev/berth/internal/runplan"

// ReasonProviderNeedsNetwork fails a run whose model is reached over the
// network while the agent has none (docs/adr/0004-providers-need-network.md).
// The check is part of the run plan (internal/runplan).
const ReasonProviderNeedsNetwork = runplan.ReasonProviderNeedsNetwork
