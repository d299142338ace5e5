package boltstore

import (
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func TestOpenMigratesInOrderAndRefusesNewerDatabases(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "x.db")
	var applied []int
	mig := func(v int) Migration {
		return Migration{Version: v, Apply: func(tx *bolt.Tx) error { applied = append(applied, v); return nil }}
	}

	db, err := Open(path, "berth-test", []Migration{mig(1)})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	// A newer build applies only what the database has not seen.
	db, err = Open(path, "berth-test", []Migration{mig(1), mig(2), mig(3)})
	if err != nil {
		t.Fatal(err)
	}
	_ = db.View(func(tx *bolt.Tx) error {
		if v, _ := Version(tx); v != 3 {
			t.Errorf("version = %d, want 3", v)
		}
		return nil
	})
	db.Close()
	if want := []int{1, 2, 3}; len(applied) != 3 || applied[0] != 1 || applied[1] != 2 || applied[2] != 3 {
		t.Fatalf("applied %v, want %v", applied, want)
	}
	// An older build refuses a database it does not understand.
	if _, err := Open(path, "berth-test", []Migration{mig(1)}); err == nil || !strings.Contains(err.Error(), "newer than this berth-test knows") {
		t.Fatalf("old build opened a newer database: %v", err)
	}
}

func TestSecondOpenerFailsInsteadOfHanging(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "x.db")
	db, err := Open(path, "berth-test", []Migration{{Version: 1, Apply: func(*bolt.Tx) error { return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := Open(path, "berth-test", nil); err == nil || !strings.Contains(err.Error(), "is berth-test already running?") {
		t.Fatalf("second opener: %v", err)
	}
}
