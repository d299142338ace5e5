package scheduler

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/config"
)

func waitRetention(t *testing.T, s *Service) retainReport {
	t.Helper()
	select {
	case rep := <-s.retained:
		if rep.Err != nil {
			t.Fatalf("retention pass failed: %v", rep.Err)
		}
		return rep
	case <-time.After(10 * time.Second):
		t.Fatal("no retention pass within 10s")
		return retainReport{}
	}
}

func storedConversations(t *testing.T, s *Service) map[string]conversation {
	t.Helper()
	out := map[string]conversation{}
	err := s.store.db.View(func(tx *bolt.Tx) error {
		return historyBucket(tx).ForEach(func(k, v []byte) error {
			c, err := decodeConversation(k, v)
			out[string(k)] = c
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRetentionPrunesOnlyFinishedDeliveredWork(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	now := clock.Now()
	ago := func(h int) time.Time { return now.Add(-time.Duration(h) * time.Hour) }
	run := func(msg, agent, state string, created time.Time, delivered bool) Run {
		r := Run{ID: newRunID(created), MessageID: msg, Agent: agent, State: state, CreatedAt: created, Delivered: delivered, Connector: "hook"}
		if Finished(state) {
			r.FinishedAt = created.Add(time.Minute)
		}
		return r
	}
	oldDelivered := run("m-old", "alpha", StateSucceeded, ago(50), true)
	oldUndelivered := run("m-undelivered", "alpha", StateFailed, ago(51), false)
	oldQueued := run("m-queued", "gamma", StateQueued, ago(50), false)
	var recent []Run
	for i := range 5 {
		recent = append(recent, run("m-recent"+string(rune('a'+i)), "beta", StateSucceeded, ago(5-i), true))
	}
	dir := t.TempDir()
	writeRuns(t, dir, append([]Run{oldDelivered, oldUndelivered, oldQueued}, recent...)...)
	turns := []agentproto.Turn{{Role: "user", Text: "q"}, {Role: "assistant", Text: "a"}}
	st, err := openStore(dir + "/" + DBName)
	if err != nil {
		t.Fatal(err)
	}
	err = st.db.Update(func(tx *bolt.Tx) error {
		if err := putConversation(tx, []byte("idle"), conversation{UpdatedAt: ago(72), Turns: turns}); err != nil {
			return err
		}
		if err := putConversation(tx, []byte("active"), conversation{UpdatedAt: ago(1), Turns: turns}); err != nil {
			return err
		}
		old, _ := json.Marshal(turns) // schema version 2: a bare array, no time
		return historyBucket(tx).Put([]byte("untimed"), old)
	})
	st.close()
	if err != nil {
		t.Fatal(err)
	}

	cfg := testConfig(4)
	cfg.Retention = config.Retention{FinishedRuns: 24 * time.Hour, RunsPerAgent: 3, IdleConversation: 48 * time.Hour}
	s := newTestService(t, cfg, dir, newGateBackend("landlock"), nil, withClock(clock))
	s.retained = make(chan retainReport, 10)
	start(t, s)

	rep := waitRetention(t, s)
	if rep.Runs != 3 || rep.Conversations != 1 {
		t.Fatalf("first pass deleted %d runs and %d conversations, want 3 (one too old, two beyond 3 per agent) and 1", rep.Runs, rep.Conversations)
	}
	want := []string{recent[4].ID, recent[3].ID, recent[2].ID, oldQueued.ID, oldUndelivered.ID}
	if ids := listIDs(t, s, RunFilter{}); !slices.Equal(ids, want) {
		t.Fatalf("runs kept = %v, want %v", ids, want)
	}
	if _, err := s.GetRun(oldDelivered.ID); err == nil {
		t.Fatal("an old delivered run is still there")
	}
	convs := storedConversations(t, s)
	if _, ok := convs["idle"]; ok || len(convs) != 2 || !convs["untimed"].UpdatedAt.Equal(now) {
		t.Fatalf("conversations after the first pass = %v; want active, and untimed stamped now", convs)
	}
	// A deleted run's message id is free again; a kept one still maps.
	if again := submit(t, s, "m-undelivered", "alpha"); again != oldUndelivered.ID {
		t.Fatalf("Submit of a kept run's message = %s, want %s", again, oldUndelivered.ID)
	}

	// Two days later the recent runs and the untimed conversation are old.
	clock.Advance(49 * time.Hour)
	rep = waitRetention(t, s)
	if rep.Runs != 3 || rep.Conversations != 2 {
		t.Fatalf("second pass deleted %d runs and %d conversations, want 3 and 2", rep.Runs, rep.Conversations)
	}
	for _, id := range []string{oldUndelivered.ID, oldQueued.ID} {
		if _, err := s.GetRun(id); err != nil {
			t.Fatalf("run %s, undelivered or not finished, was deleted: %v", id, err)
		}
	}
}

func TestRetentionDeletesMoreRunsThanOneTransactionHolds(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	dir := t.TempDir()
	old := clock.Now().Add(-100 * 24 * time.Hour)
	var runs []Run
	for i := range 2*retentionBatch + 10 {
		at := old.Add(time.Duration(i) * time.Second)
		runs = append(runs, Run{ID: newRunID(at), MessageID: newRunID(at), Agent: "alpha", State: StateSucceeded, Delivered: true, CreatedAt: at, FinishedAt: at})
	}
	writeRuns(t, dir, runs...)
	s := newTestService(t, testConfig(4), dir, newGateBackend("landlock"), nil, withClock(clock))
	deleted, err := s.pruneOldRuns(t.Context(), clock.Now().Add(-30*24*time.Hour))
	if err != nil || deleted != len(runs) {
		t.Fatalf("pruneOldRuns = %d, %v; want %d", deleted, err, len(runs))
	}
	if ids := listIDs(t, s, RunFilter{}); len(ids) != 0 {
		t.Fatalf("%d runs left after pruning, want none", len(ids))
	}
}
