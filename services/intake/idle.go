package intake

import (
	"github.com/berth-dev/berth/internal/config"
)

// Pending reports how many accepted messages wait to be handed to the
// scheduler and how many replies wait to be delivered. A service with
// either may not stop for idleness. It reads counters kept after each
// commit; it never walks the store.
func (s *Service) Pending() (inbox, outbox uint32, err error) {
	inbox, outbox = s.store.pendingCounts()
	return inbox, outbox, nil
}

// HasLongLivedConnector reports whether cfg has a connector that keeps a
// connection open (MeepaChat's and Discord's gateways, Slack in Socket
// Mode), so intake must not exit when idle. Webhooks, Discord without a bot
// token (interactions only) and Slack's Events API are HTTP-only: intake may
// exit and be socket-activated again. A running Service answers the same
// from its built connectors (Service.HasLongLivedConnector).
func HasLongLivedConnector(cfg *config.Config) bool {
	for _, c := range cfg.Connectors {
		if longLivedType(c) {
			return true
		}
	}
	return false
}

func longLivedType(c config.Connector) bool {
	switch c.Type {
	case config.ConnectorWebhook:
		return false
	case config.ConnectorDiscord:
		return c.Token != ""
	case config.ConnectorSlack:
		return c.Mode != config.SlackEvents
	default:
		return true // meepachat, and any type this intake does not know
	}
}
