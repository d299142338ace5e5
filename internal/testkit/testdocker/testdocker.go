// Package testdocker gives tests a client of the local Docker engine, or
// fails them under CI=true (skips elsewhere) when no engine answers.
package testdocker

import (
	"context"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/imagectl"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// Engine returns a client of the engine DOCKER_HOST (or the default socket)
// names, negotiated down to the engine's API version, that makes no spans
// (as berth's own: imagectl.NewEngineClient); it is closed when the test
// ends.
func Engine(t testing.TB) *client.Client {
	t.Helper()
	cli, err := imagectl.NewEngineClient()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
	}
	testenv.Need(t, err == nil, "no Docker engine answers (scripts/test.sh starts one): %v", err)
	t.Cleanup(func() { cli.Close() })
	return cli
}
