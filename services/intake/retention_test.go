package intake

import (
	"github.com/berth-dev/berth/internal/busapi"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	bolt "go.etcd.io/bbolt"
)

func TestFinishedEntriesArePrunedAfterTheRetentionWindow(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		delivered time.Duration // [retention] delivered
		advance   time.Duration
		wantKept  bool
	}{
		{"Within_the_default_72h_a_retry_still_runs_nothing_twice", 0, 71 * time.Hour, true},
		{"After_the_default_72h_finished_entries_are_gone", 0, 73 * time.Hour, false},
		{"A_window_below_24h_is_raised_to_24h", time.Hour, 23 * time.Hour, true},
		{"After_a_configured_48h_they_are_gone", 48 * time.Hour, 49 * time.Hour, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rs := newReplyServer(t, 0)
			clock := clockwork.NewFakeClockAt(time.Now())
			cfg := testConfig(rs.URL)
			cfg.Retention.Delivered = tc.delivered
			sub := newCountingSubmitter()
			s, path := newTestService(t, cfg, WithClock(clock), WithSubmitter(sub))
			passes := passHook(s)
			runService(t, s)
			passes.waitFor(t, "retention") // the first prune, at start

			body := mustJSON(t, map[string]string{"id": "old-1", "channel": "ops", "author": "a", "text": "hi"})
			if code, out := post(t, s, signedRequest("hooks", body, testSecret, clock.Now())); code != http.StatusAccepted {
				t.Fatalf("post: %d %v", code, out)
			}
			eventually(t, "the message is submitted", func() bool {
				m, _, _ := s.store.message("hooks", "old-1")
				return m.State == stateSubmitted
			})
			if err := s.Deliver(busapi.ReplyFromWire(map[string]string{"run_id": "run-1", "message_id": "hooks/old-1", "connector": "hooks", "state": "succeeded", "text": "done"})); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the reply is delivered", func() bool { _, n := rs.counts(); return n == 1 })

			clock.Advance(tc.advance)
			passes.waitFor(t, "retention")
			_, kept, err := s.store.message("hooks", "old-1")
			if err != nil {
				t.Fatal(err)
			}
			if kept != tc.wantKept {
				t.Fatalf("message kept = %v after %v, want %v", kept, tc.advance, tc.wantKept)
			}
			if tc.wantKept {
				// The platform retries the event: it is acknowledged and runs nothing.
				if code, _ := post(t, s, signedRequest("hooks", body, testSecret, clock.Now())); code != http.StatusAccepted {
					t.Fatalf("retry: %d", code)
				}
				if inbox, _ := s.store.pendingCounts(); inbox != 0 || sub.callsFor("hooks/old-1") != 1 {
					t.Fatalf("a retry within the window queued %d messages, Submit called %d times; want 0 and 1", inbox, sub.callsFor("hooks/old-1"))
				}
			}
			s.Close()
			counts := countEntries(t, path)
			want := 0
			if tc.wantKept {
				want = 1
			}
			for _, bucket := range []string{"inbox/messages", "inbox/done", "outbox/replies", "outbox/done"} {
				if counts[bucket] != want {
					t.Errorf("%s holds %d entries, want %d", bucket, counts[bucket], want)
				}
			}
		})
	}
}

func TestPruningABacklogTakesSmallTransactions(t *testing.T) {
	t.Parallel()
	st, err := openStore(filepath.Join(t.TempDir(), DBName))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	long := time.Now().Add(-100 * time.Hour)
	const n = pruneBatch*2 + 10
	// One transaction for the backlog: a commit per entry would take seconds.
	err = st.db.Update(func(tx *bolt.Tx) error {
		for i := range n {
			m := inboxEntry{Connector: "hooks", ID: "m" + strconv.Itoa(i), Channel: "c", Author: "a", Text: "t", Agent: "x", ReceivedAt: long}
			if _, err := enqueue(inboxQueue(tx), &m); err != nil {
				return err
			}
			if _, err := update(inboxQueue(tx), m.Key(), long, func(m *inboxEntry) { m.State = stateSubmitted }); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	fresh, _, err := st.accept(inboxEntry{Connector: "hooks", ID: "fresh", Channel: "c", Author: "a", Text: "t", Agent: "x", ReceivedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.markSubmitted(fresh.Key(), "run-fresh", 1, time.Now()); err != nil {
		t.Fatal(err)
	}
	var rounds, total int
	for {
		deleted, more, err := st.pruneFinished(time.Now().Add(-72 * time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if deleted > pruneBatch {
			t.Fatalf("one transaction deleted %d entries, want at most %d", deleted, pruneBatch)
		}
		rounds++
		total += deleted
		if !more {
			break
		}
	}
	if total != n || rounds != 3 {
		t.Fatalf("pruned %d entries in %d transactions, want %d in 3", total, rounds, n)
	}
	if _, found, _ := st.message("hooks", "fresh"); !found {
		t.Fatal("a message finished within the window was pruned")
	}
}

func TestVersion1DatabaseGetsTheDoneIndexesAndPendingByConnector(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), DBName)
	delivered := time.Now().Add(-80 * time.Hour).UTC()
	// A database as berth-intake of schema version 1 left it: one submitted
	// message, one pending message, one delivered reply.
	writeDB(t, path, func(tx *bolt.Tx) error {
		if err := createV1Buckets(tx); err != nil {
			return err
		}
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		if err := meta.Put(keySchema, u64(1)); err != nil {
			return err
		}
		inbox := tx.Bucket(bucketInbox)
		msgs, pend := inbox.Bucket(bucketMessages), inbox.Bucket(bucketPending)
		put := func(b *bolt.Bucket, k, v string) error { return b.Put([]byte(k), []byte(v)) }
		if err := put(msgs, "hooks/a", `{"connector":"hooks","id":"a","state":"submitted","received_at":"`+delivered.Format(time.RFC3339Nano)+`","seq":1}`); err != nil {
			return err
		}
		if err := put(msgs, "hooks/b", `{"connector":"hooks","id":"b","state":"pending","received_at":"`+time.Now().UTC().Format(time.RFC3339Nano)+`","seq":2}`); err != nil {
			return err
		}
		if err := pend.Put(u64(2), []byte("hooks/b")); err != nil {
			return err
		}
		replies := tx.Bucket(bucketOutbox).Bucket(bucketReplies)
		return put(replies, "run-1", `{"run_id":"run-1","message_id":"a","connector":"hooks","state":"delivered","delivered_at":"`+delivered.Format(time.RFC3339Nano)+`","seq":1}`)
	})
	st, err := openStore(path)
	if err != nil {
		t.Fatalf("openStore: %v", err)
	}
	defer st.Close()
	if in, out := st.pendingCounts(); in != 1 || out != 0 {
		t.Fatalf("pending counts after migration = %d, %d; want 1, 0", in, out)
	}
	deleted, _, err := st.pruneFinished(time.Now().Add(-72 * time.Hour))
	if err != nil || deleted != 2 {
		t.Fatalf("pruned %d entries (%v), want the finished message and the delivered reply", deleted, err)
	}
	if pending, err := st.pendingMessagesOf("hooks"); err != nil || len(pending) != 1 || pending[0].ID != "b" {
		t.Fatalf("pending messages of hooks after migration = %+v (%v), want b", pending, err)
	}
}

func TestLastProgressMovesWhileIntakeIsIdle(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Now())
	s, _ := newTestService(t, testConfig(""), WithClock(clock), WithSubmitter(newCountingSubmitter()))
	start := clock.Now()
	runService(t, s)
	// Nothing to do for a minute: both loops still pass at least every 5 s.
	for range 60 {
		clock.Advance(time.Second)
		eventually(t, "both loops passed within the last 5s", func() bool {
			return !s.LastProgress().Before(clock.Now().Add(-idlePass))
		})
	}
	if !s.LastProgress().After(start.Add(50 * time.Second)) {
		t.Fatalf("LastProgress = start+%v after a minute, want more than 50s", s.LastProgress().Sub(start))
	}
}
