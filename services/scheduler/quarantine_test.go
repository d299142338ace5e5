package scheduler

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/boltstore"
)

// quarantinedRecords reads quarantine/.
func quarantinedRecords(t *testing.T, s *Service) map[string]quarantined {
	t.Helper()
	out := map[string]quarantined{}
	err := s.store.db.View(func(tx *bolt.Tx) error {
		return quarantineBucket(tx).ForEach(func(k, v []byte) error {
			var q quarantined
			if err := json.Unmarshal(v, &q); err != nil {
				return err
			}
			out[string(k)] = q
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func listIDs(t *testing.T, s *Service, f RunFilter) []string {
	t.Helper()
	runs, err := s.ListRuns(f)
	if err != nil {
		t.Fatalf("ListRuns(%+v): %v", f, err)
	}
	var ids []string
	for _, r := range runs {
		ids = append(ids, r.ID)
	}
	return ids
}

func TestUndecodableRecordsAreQuarantinedAndTheSchedulerGoesOn(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	now := time.Now()
	writeRuns(t, dir,
		Run{ID: "r1_running", MessageID: "m1", Agent: "alpha", State: StateRunning, Attempts: 1, Seq: 1, CreatedAt: now},
		Run{ID: "r2_queued", MessageID: "m2", Agent: "beta", State: StateQueued, Seq: 2, CreatedAt: now},
		Run{ID: "r3_done", MessageID: "m3", Agent: "gamma", State: StateSucceeded, Reply: "fine", Delivered: true, Seq: 3, CreatedAt: now},
	)
	st, err := openStore(filepath.Join(dir, DBName))
	if err != nil {
		t.Fatal(err)
	}
	err = st.db.Update(func(tx *bolt.Tx) error {
		// What a bug or a bad disk leaves: bytes that are no JSON run.
		if err := runsBucket(tx).Put([]byte("r1_running"), []byte("\x00garbage{")); err != nil {
			return err
		}
		if err := runsBucket(tx).Put([]byte("r2_queued"), []byte(`{"id": 7`)); err != nil {
			return err
		}
		return summariesBucket(tx).Put([]byte("r3_done"), []byte("not a summary"))
	})
	st.close()
	if err != nil {
		t.Fatal(err)
	}

	b := newGateBackend("landlock")
	s := newTestService(t, testConfig(4), dir, b, nil)
	// Listing before anything else runs: the broken summary is set aside and
	// rebuilt from its sound run.
	if ids := listIDs(t, s, RunFilter{State: StateSucceeded}); !slices.Equal(ids, []string{"r3_done"}) {
		t.Fatalf("succeeded runs = %v, want [r3_done]", ids)
	}
	start(t, s) // reconcile reads r1_running, the dispatcher r2_queued
	waitPass(t, s)

	id := submit(t, s, "m4", "alpha")
	b.next(t).reply("still working")
	waitState(t, s, id, StateSucceeded)

	if ids := listIDs(t, s, RunFilter{}); !slices.Equal(ids, []string{"r3_done", id}) { // ids sort as written
		t.Fatalf("ListRuns = %v, want the new run and r3_done (the broken ones set aside)", ids)
	}
	if ids := listIDs(t, s, RunFilter{State: StateQueued}); len(ids) != 0 {
		t.Fatalf("queued runs = %v, want none", ids)
	}
	q := quarantinedRecords(t, s)
	for _, key := range []string{"runs/r1_running", "runs/r2_queued", "summaries/r3_done"} {
		rec, ok := q[key]
		if !ok {
			t.Fatalf("quarantine lacks %s: %v", key, q)
		}
		if !strings.Contains(rec.Reason, "cannot decode") || len(rec.Value) == 0 {
			t.Fatalf("quarantined %s = %+v, want the reason and the bytes", key, rec)
		}
	}
	if r, err := s.GetRun("r3_done"); err != nil || r.Reply != "fine" {
		t.Fatalf("GetRun(r3_done) = %+v, %v", r, err)
	}
	if _, err := s.GetRun("r1_running"); err == nil {
		t.Fatal("a quarantined run is still readable")
	}
	if n := queueDepth(t, s); n != 0 {
		t.Fatalf("QueueDepth = %d after quarantine, want 0", n)
	}
}

func queueDepth(t *testing.T, s *Service) int {
	t.Helper()
	n := 0
	if err := s.store.db.View(func(tx *bolt.Tx) error { n = queueBucket(tx).Stats().KeyN; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestAVersion2DatabaseGainsIndexesAndQuarantinesWhatItCannotRead(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, DBName)
	db, err := boltstore.Open(path, "berth-scheduler", migrations[:2])
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	old := []Run{
		{ID: "r1", MessageID: "m1", Agent: "alpha", State: StateSucceeded, Reply: "old", Delivered: true, Seq: 1, CreatedAt: now},
		{ID: "r2", MessageID: "m2", Agent: "alpha", State: StateRunning, Attempts: 1, Seq: 2, CreatedAt: now},
		{ID: "r3", MessageID: "m3", Agent: "alpha", State: StateQueued, Seq: 3, CreatedAt: now},
		{ID: "r4", MessageID: "m4", Agent: "beta", State: StateFailed, Reason: "timeout", Connector: "hook", Seq: 4, CreatedAt: now},
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, r := range old {
			if err := putRunV2(tx, r); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketRuns).Put([]byte("r5"), []byte("{broken"))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	b := newGateBackend("landlock")
	d := newDeliveries(0)
	s := newTestService(t, testConfig(4), dir, b, d)
	tests := []struct {
		name   string
		filter RunFilter
		want   []string
	}{
		{"Every_run_is_listed_newest_first", RunFilter{}, []string{"r4", "r3", "r2", "r1"}},
		{"The_state_index_knows_the_running_run", RunFilter{State: StateRunning}, []string{"r2"}},
		{"The_agent_index_knows_alphas_runs", RunFilter{Agent: "alpha"}, []string{"r3", "r2", "r1"}},
		{"Both_filters_combine", RunFilter{Agent: "alpha", State: StateSucceeded}, []string{"r1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if ids := listIDs(t, s, tc.filter); !slices.Equal(ids, tc.want) {
				t.Fatalf("ListRuns(%+v) = %v, want %v", tc.filter, ids, tc.want)
			}
		})
	}
	if q := quarantinedRecords(t, s); len(q) != 1 || q["runs/r5"].Reason == "" {
		t.Fatalf("quarantine = %v, want runs/r5 with a reason", q)
	}

	// The migrated indexes drive reconcile, the queue and deliveries.
	start(t, s)
	first := b.next(t)
	if first.spec.RunID != "r2" {
		t.Fatalf("first run started is %s, want the interrupted r2", first.spec.RunID)
	}
	first.reply("again")
	if second := b.next(t); second.spec.RunID != "r3" {
		t.Fatalf("second run started is %s, want r3", second.spec.RunID)
	} else {
		second.reply("queued one")
	}
	waitDeliveredTo(t, s, d, "r4")
	waitState(t, s, "r3", StateSucceeded)
}
