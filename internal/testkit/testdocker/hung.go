package testdocker

import (
	"net"
	"path/filepath"
	"sync"
	"testing"
)

// HungEngine is a Docker socket that accepts connections and never answers:
// it reads nothing and writes nothing. It returns the engine's host URL
// ("unix://…") for client.WithHost; the socket closes when the test ends.
func HungEngine(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "unix://" + sock
}
