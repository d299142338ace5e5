package images

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/boltstore"
)

func TestStore(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	t.Run("A_database_of_the_current_version_reopens_with_its_records", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "images.db")
		s, err := openStore(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.putImage(Record{Tag: "berth-sandbox:0123456789abcdef", Kind: "sandbox", Status: StatusReady}); err != nil {
			t.Fatal(err)
		}
		s.close()
		s, err = openStore(path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		r, ok, err := s.image("berth-sandbox:0123456789abcdef")
		if err != nil || !ok || r.Status != StatusReady {
			t.Fatalf("record after reopening: %+v, %v, %v", r, ok, err)
		}
	})
	t.Run("A_database_of_a_newer_berth_imaged_is_refused", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "images.db")
		db, err := boltstore.Open(path, "berth-imaged", append(migrations, boltstore.Migration{Version: len(migrations) + 1, Apply: func(*bolt.Tx) error { return nil }}))
		if err != nil {
			t.Fatal(err)
		}
		db.Close()
		if _, err := openStore(path); err == nil || !strings.Contains(err.Error(), "newer than this berth-imaged knows") {
			t.Fatalf("openStore on a newer database: %v", err)
		}
	})
	t.Run("Builds_a_stopped_process_left_running_end_as_interrupted", func(t *testing.T) {
		t.Parallel()
		s, err := openStore(filepath.Join(t.TempDir(), "images.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		j, err := s.newJob("ops", now)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.putImage(Record{Tag: "berth-isolated:1-abc", Status: StatusBuilding}); err != nil {
			t.Fatal(err)
		}
		if n, err := s.interruptLeftovers(now); err != nil || n != 2 {
			t.Fatalf("interruptLeftovers = %d, %v; want 2", n, err)
		}
		r, _, _ := s.image("berth-isolated:1-abc")
		if r.Status != StatusFailed || !strings.Contains(r.Error, "interrupted") {
			t.Fatalf("building record after a restart: %+v", r)
		}
		var got JobRecord
		_ = s.db.View(func(tx *bolt.Tx) error {
			return jsonUnmarshal(tx.Bucket(bucketJobs).Get(boltstore.U64(j.ID)), &got)
		})
		if got.State != JobFailed {
			t.Fatalf("running job after a restart: %+v", got)
		}
	})
	t.Run("Only_the_newest_finished_jobs_are_kept", func(t *testing.T) {
		t.Parallel()
		s, err := openStore(filepath.Join(t.TempDir(), "images.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		for range keptJobs + 5 {
			j, err := s.newJob("ops", now)
			if err != nil {
				t.Fatal(err)
			}
			j.State = JobSucceeded
			if err := s.finishJob(j); err != nil {
				t.Fatal(err)
			}
		}
		var n int
		_ = s.db.View(func(tx *bolt.Tx) error { n = tx.Bucket(bucketJobs).Stats().KeyN; return nil })
		if n != keptJobs {
			t.Fatalf("jobs kept: %d, want %d", n, keptJobs)
		}
	})
}
