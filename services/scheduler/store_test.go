package scheduler

import (
	"encoding/binary"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

type boltTx = bolt.Tx

func TestOpenStore(t *testing.T) {
	t.Parallel()
	t.Run("Second_opener_fails_fast_with_a_clear_error", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), DBName)
		st, err := openStore(path)
		if err != nil {
			t.Fatal(err)
		}
		defer st.close()
		began := time.Now()
		_, err = openStore(path)
		if err == nil || !strings.Contains(err.Error(), "another process holds it") {
			t.Fatalf("second open error = %v, want 'another process holds it'", err)
		}
		if waited := time.Since(began); waited > 3*time.Second {
			t.Fatalf("second open waited %s", waited)
		}
	})
	t.Run("Empty_database_of_version_0_is_migrated_to_the_current_version", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), DBName)
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		db.Close()
		st, err := openStore(path)
		if err != nil {
			t.Fatal(err)
		}
		defer st.close()
		err = st.db.View(func(tx *bolt.Tx) error {
			for _, name := range [][]byte{bucketRuns, bucketMessages, bucketQueue, bucketDeliveries} {
				if tx.Bucket(name) == nil {
					t.Errorf("bucket %s missing", name)
				}
			}
			if v := tx.Bucket(bucketMeta).Get(keyVersion); binary.BigEndian.Uint64(v) != uint64(schemaVersion()) {
				t.Errorf("version = %d, want %d", binary.BigEndian.Uint64(v), schemaVersion())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("Database_from_a_newer_build_is_refused", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), DBName)
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = db.Update(func(tx *bolt.Tx) error {
			b, _ := tx.CreateBucket(bucketMeta)
			return b.Put(keyVersion, u64(uint64(schemaVersion()+1)))
		})
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := openStore(path); err == nil || !strings.Contains(err.Error(), "newer than this berth-scheduler knows") {
			t.Fatalf("open error = %v, want 'newer than this berth-scheduler knows'", err)
		}
	})
}

func TestRunIDsSortByTimeAndAreUnique(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 5, time.UTC)
	a, b := newRunID(t0), newRunID(t0.Add(time.Nanosecond))
	if !(a < b) {
		t.Fatalf("%s does not sort before %s", a, b)
	}
	if newRunID(t0) == newRunID(t0) {
		t.Fatal("two ids of the same instant are equal")
	}
	for _, c := range a {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			t.Fatalf("id %s has %q, not allowed in an object path element", a, c)
		}
	}
}
