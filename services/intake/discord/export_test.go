package discord

import "time"

// Backoff exposes the reconnect back-off to the tests.
func (c *Connector) Backoff(n int) time.Duration { return c.backoff(n) }
