// Package boltstore opens a service's BoltDB file the way every berth store
// needs it: with a lock timeout (a second opener fails instead of hanging),
// and migrated through an ordered list of schema versions kept in meta/version.
package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

var (
	bucketMeta = []byte("meta")
	keyVersion = []byte("version")
)

// Migration brings a database from Version-1 to Version. A service keeps an
// ordered slice of them; append, never edit a released one.
type Migration struct {
	Version int
	Apply   func(tx *bolt.Tx) error
}

// LockTimeout is how long Open waits for another process's lock.
const LockTimeout = time.Second

// Open opens (creating and migrating when needed) the database at path for
// the named service. A database newer than the migrations know is refused.
func Open(path, service string, migrations []Migration) (*bolt.DB, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("cannot create state directory: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: LockTimeout})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("cannot open %s: another process holds it (is %s already running?)", path, service)
	}
	if err != nil {
		return nil, fmt.Errorf("cannot open %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return migrate(tx, service, migrations) }); err != nil {
		db.Close()
		return nil, fmt.Errorf("cannot migrate %s: %w", path, err)
	}
	return db, nil
}

// Version returns the schema version recorded in an open transaction (0 when none).
func Version(tx *bolt.Tx) (int, error) {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		return 0, nil
	}
	v := meta.Get(keyVersion)
	if v == nil {
		return 0, nil
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("schema version is %d bytes long, want 8", len(v))
	}
	return int(binary.BigEndian.Uint64(v)), nil
}

func migrate(tx *bolt.Tx, service string, migrations []Migration) error {
	current, err := Version(tx)
	if err != nil {
		return err
	}
	latest := migrations[len(migrations)-1].Version
	if current > latest {
		return fmt.Errorf("schema version %d is newer than this %s knows (%d)", current, service, latest)
	}
	for _, m := range migrations {
		if m.Version <= current {
			continue
		}
		if err := m.Apply(tx); err != nil {
			return fmt.Errorf("migration to version %d failed: %w", m.Version, err)
		}
		current = m.Version
	}
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return fmt.Errorf("cannot create meta bucket: %w", err)
	}
	return meta.Put(keyVersion, U64(uint64(current)))
}

// U64 encodes v big-endian, so keys sort numerically.
func U64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}
