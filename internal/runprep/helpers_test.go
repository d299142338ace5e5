package runprep

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// loadConfig is berth.toml text loaded as berthd would load it.
func loadConfig(t *testing.T, text string) *config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "berth.toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// uidDB is a real bbolt file for the agents' uids, closed when the test ends.
func uidDB(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "uids.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// storedUIDs are the agents agent_uids/ holds a uid for.
func storedUIDs(t *testing.T, db *bolt.DB) map[string]uint32 {
	t.Helper()
	out := map[string]uint32{}
	err := db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketAgentUIDs)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			out[string(k)] = binary.BigEndian.Uint32(v)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// recordingBackend is a backend that runs nothing; as a Sweeper it reports
// what live said of attempts 0 to 2 of run, and as a Warmer it keeps the
// specs it was handed.
type recordingBackend struct {
	name string
	run  string

	mu     sync.Mutex
	said   [][3]bool
	warmed [][]isolation.Spec
}

func (b *recordingBackend) Name() string { return b.name }
func (b *recordingBackend) Run(context.Context, isolation.Spec) (isolation.Result, error) {
	return isolation.Result{}, nil
}
func (b *recordingBackend) Kill(context.Context, string) error { return nil }

func (b *recordingBackend) Sweep(_ context.Context, live func(runID string, attempt int) bool) ([]string, error) {
	var said [3]bool
	for attempt := range said {
		said[attempt] = live(b.run, attempt)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.said = append(b.said, said)
	return nil, nil
}

func (b *recordingBackend) Warm(specs []isolation.Spec) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.warmed = append(b.warmed, specs)
}

func (b *recordingBackend) Drain(context.Context) error { return nil }

// fakeImages answers EnsureIsolationImageWith as berth-imaged would.
type fakeImages struct {
	tag string
	err error
}

func (f fakeImages) EnsureIsolationImageWith(context.Context, string, busapi.EnsureOptions) (string, error) {
	return f.tag, f.err
}
