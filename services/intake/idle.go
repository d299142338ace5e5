package intake

import (
	"slices"

	"github.com/berth-dev/berth/internal/config"
)

// Pending reports how many accepted messages wait to be handed to the
// scheduler and how many replies wait to be delivered. A service with
// either may not stop for idleness.
func (s *Service) Pending() (inbox, outbox uint32, err error) {
	return s.store.pendingCounts()
}

// ShortLivedConnectorTypes are the connector types that need no process
// between requests (the platform calls in). Any other type keeps a
// connection open, and intake must stay up.
var ShortLivedConnectorTypes = []string{"webhook"}

// HasLongLivedConnector reports whether cfg has a connector that keeps a
// connection open (a WebSocket gateway), so intake must not exit when idle.
func HasLongLivedConnector(cfg *config.Config) bool {
	for _, c := range cfg.Connectors {
		if !slices.Contains(ShortLivedConnectorTypes, c.Type) {
			return true
		}
	}
	return false
}
