package intake

import (
	"github.com/berth-dev/berth/internal/busapi"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestOpenStore(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		prepare func(t *testing.T, path string)
		wantErr string
	}{
		{"New_database_gets_the_current_schema", func(*testing.T, string) {}, ""},
		{"Database_of_version_0_is_migrated", func(t *testing.T, path string) {
			writeDB(t, path, func(tx *bolt.Tx) error {
				_, err := tx.CreateBucket([]byte("unrelated"))
				return err
			})
		}, ""},
		{"Database_of_a_newer_berth_is_refused", func(t *testing.T, path string) {
			writeDB(t, path, func(tx *bolt.Tx) error {
				meta, err := tx.CreateBucket(bucketMeta)
				if err != nil {
					return err
				}
				return meta.Put(keySchema, u64(uint64(schemaVersion()+1)))
			})
		}, "newer than this berth-intake knows"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), DBName)
			tc.prepare(t, path)
			st, err := openStore(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("openStore error = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("openStore: %v", err)
			}
			defer st.Close()
			err = st.db.View(func(tx *bolt.Tx) error {
				if v := tx.Bucket(bucketMeta).Get(keySchema); len(v) != 8 || int(v[7]) != schemaVersion() {
					t.Errorf("schema_version = %v, want %d", v, schemaVersion())
				}
				messages, inPending, inDone := inboxBuckets(tx)
				replies, outPending, outDone := outboxBuckets(tx)
				if messages == nil || inPending == nil || inDone == nil || replies == nil || outPending == nil || outDone == nil {
					t.Error("inbox and outbox buckets are missing")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

func writeDB(t *testing.T, path string, fn func(*bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestSecondOpenerGivesUpWithAClearError(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), DBName)
	first, err := openStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	start := time.Now()
	_, err = openStore(path)
	if err == nil || !strings.Contains(err.Error(), "another process holds it") {
		t.Fatalf("second open error = %v, want 'another process holds it'", err)
	}
	if waited := time.Since(start); waited > 3*time.Second {
		t.Fatalf("second open waited %v, want about 1s", waited)
	}
}

func TestPendingWorkSurvivesARestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig("")
	s, err := New(cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	// No submitter and no Run: both entries stay pending, as after a crash
	// right after the acknowledgement.
	if status, out := post(t, s, signedRequest("hooks", []byte(`{"id":"keep","channel":"ops","author":"ada","text":"hi"}`), testSecret, time.Now())); status != 202 {
		t.Fatalf("status %d (%v), want 202", status, out)
	}
	if err := s.Deliver(busapi.ReplyFromWire(map[string]string{"run_id": "run-9", "message_id": "hooks/keep", "connector": "hooks", "text": "done"})); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	again, err := New(cfg, dir)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer again.Close()
	msgs, err := again.store.pendingMessages()
	if err != nil || len(msgs) != 1 || msgs[0].ID != "keep" || msgs[0].Agent != "ops-agent" {
		t.Fatalf("pending inbox after reopen = %+v (%v), want message keep for ops-agent", msgs, err)
	}
	replies, err := again.store.pendingReplies()
	if err != nil || len(replies) != 1 || replies[0].RunID != "run-9" || replies[0].MessageID != "keep" || replies[0].Channel != "ops" {
		t.Fatalf("pending outbox after reopen = %+v (%v), want run-9 for message keep on channel ops", replies, err)
	}
}
