package container_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/moby/moby/client"

	"github.com/berth-dev/berth/isolation/container"
)

func backendAt(t *testing.T, socket string) *container.Backend {
	t.Helper()
	cli, err := client.New(client.WithHost("unix://" + socket))
	if err != nil {
		t.Fatal(err)
	}
	b, err := container.New(container.Options{Client: cli, Instance: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A machine with no engine at all (a fresh install without Docker) has no
// container of berth's to remove: the sweep is not an error to log at every
// start.
func TestASweepWithNoEngineInstalledFindsNothingLeftBehind(t *testing.T) {
	b := backendAt(t, filepath.Join(t.TempDir(), "docker.sock"))
	removed, err := b.Sweep(context.Background(), nil)
	if err != nil || len(removed) != 0 {
		t.Fatalf("Sweep with no engine socket = %v, %v; want nothing and no error", removed, err)
	}
}

// The control: an engine whose socket is there but does not answer is down,
// and its containers may still exist, so the sweep says it could not look.
func TestASweepOfAnEngineThatIsDownIsAnError(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "docker.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	// Closed without removing the file: a socket nobody listens on.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	b := backendAt(t, socket)
	if _, err := b.Sweep(context.Background(), nil); err == nil {
		t.Fatal("Sweep of an engine that does not answer = nil error, want the list's failure")
	}
}
