package scheduler

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/boltstore"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

func TestAVersion1DatabaseGainsHistoryAndKeepsItsRuns(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), DBName)
	db, err := boltstore.Open(path, "berth-scheduler", migrations[:1])
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return putRunV2(tx, Run{ID: "r1", Agent: "alpha", State: StateSucceeded, Reply: "old", Delivered: true})
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	st, err := openStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	err = st.db.View(func(tx *bolt.Tx) error {
		if historyBucket(tx) == nil {
			t.Error("history bucket missing after migration")
		}
		if v, _ := boltstore.Version(tx); v != schemaVersion() {
			t.Errorf("version = %d, want %d", v, schemaVersion())
		}
		r, ok, err := getRun(tx, "r1")
		if err != nil || !ok || r.Reply != "old" {
			t.Errorf("version 1 run after migration = %+v, %v, %v", r, ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestHistoryFollowsAThreadAcrossThreeMessages(t *testing.T) {
	t.Parallel()
	b := newGateBackend("landlock")
	s := newTestService(t, testConfig(4), "", b, nil)
	start(t, s)
	thread := []string{"connector", "hooks", "channel", "C1", "thread", "T1"}

	id1 := submit(t, s, "m1", "alpha", thread...)
	r1 := b.next(t)
	if len(r1.spec.Request.History) != 0 {
		t.Errorf("first message got history %+v", r1.spec.Request.History)
	}
	r1.reply("answer 1")
	waitState(t, s, id1, StateSucceeded)

	id2 := submit(t, s, "m2", "alpha", thread...)
	r2 := b.next(t)
	want := []agentproto.Turn{{Role: "user", Text: "hello m1"}, {Role: "assistant", Text: "answer 1"}}
	if !reflect.DeepEqual(r2.spec.Request.History, want) {
		t.Errorf("second message history = %+v, want %+v", r2.spec.Request.History, want)
	}
	r2.reply("answer 2")
	waitState(t, s, id2, StateSucceeded)

	// A failed run and another thread add nothing to this thread.
	idFail := submit(t, s, "m-fail", "alpha", thread...)
	b.next(t).finish <- outcome{err: isolation.Errorf(isolation.ReasonCrashed, "boom")}
	waitState(t, s, idFail, StateFailed)
	idOther := submit(t, s, "m-other", "alpha", "connector", "hooks", "channel", "C1", "thread", "T2")
	other := b.next(t)
	if len(other.spec.Request.History) != 0 {
		t.Errorf("another thread got history %+v", other.spec.Request.History)
	}
	other.reply("elsewhere")
	waitState(t, s, idOther, StateSucceeded)

	submit(t, s, "m3", "alpha", thread...)
	r3 := b.next(t)
	want = append(want, agentproto.Turn{Role: "user", Text: "hello m2"}, agentproto.Turn{Role: "assistant", Text: "answer 2"})
	if !reflect.DeepEqual(r3.spec.Request.History, want) {
		t.Errorf("third message history = %+v, want %+v", r3.spec.Request.History, want)
	}
	r3.reply("answer 3")
}

func TestHistoryIsBoundedByTurnsAndBytes(t *testing.T) {
	t.Parallel()
	var turns []agentproto.Turn
	for i := range 30 {
		turns = append(turns, agentproto.Turn{Role: "user", Text: fmt.Sprintf("q%d", i)}, agentproto.Turn{Role: "assistant", Text: fmt.Sprintf("a%d", i)})
	}
	got := boundHistory(turns)
	if len(got) != HistoryMaxTurns || got[0].Text != "q20" || got[len(got)-1].Text != "a29" {
		t.Errorf("bounded to %d turns from %q to %q; want %d from q20 to a29", len(got), got[0].Text, got[len(got)-1].Text, HistoryMaxTurns)
	}
	big := strings.Repeat("x", HistoryMaxBytes/3)
	got = boundHistory([]agentproto.Turn{{Role: "user", Text: big}, {Role: "assistant", Text: big}, {Role: "user", Text: big}, {Role: "assistant", Text: "short"}})
	if len(got) != 2 || got[0].Role != "user" {
		t.Errorf("byte bound kept %d turns starting with %q; want the last user turn and its answer", len(got), got[0].Role)
	}
}

func TestARemoteProviderWithoutNetworkFailsClosed(t *testing.T) {
	t.Parallel()
	cfg := testConfig(4)
	cfg.Providers = config.Providers{Primary: "llm", Entries: map[string]config.Provider{
		"llm": {Name: "llm", Kind: "openai", BaseURL: "http://127.0.0.1:1/v1", Model: "m"},
	}}
	yes := true
	cfg.Agents = append(cfg.Agents, config.AgentSettings{ID: "online", FileAccess: config.FileAccessSettings{AllowNetwork: &yes}})
	b := newGateBackend("landlock")
	s := newTestService(t, cfg, "", b, nil)
	start(t, s)

	id := submit(t, s, "m1", "alpha")
	r := waitState(t, s, id, StateFailed)
	if r.Reason != isolation.ReasonProviderNeedsNetwork || !strings.Contains(r.Error, `set file_access.allow_network = true for agent "alpha"`) {
		t.Errorf("run = reason %q, error %q", r.Reason, r.Error)
	}
	b.none(t, s)

	id = submit(t, s, "m2", "online")
	run := b.next(t)
	if run.spec.Request.Provider.Kind != "openai" || !run.spec.Request.Policy.Network {
		t.Errorf("request provider %+v, network %v", run.spec.Request.Provider, run.spec.Request.Policy.Network)
	}
	run.reply("ok")
	waitState(t, s, id, StateSucceeded)
}

func TestAChannelReboundToAnotherAgentDoesNotHandOverItsHistory(t *testing.T) {
	t.Parallel()
	b := newGateBackend("landlock")
	s := newTestService(t, testConfig(4), "", b, nil)
	start(t, s)
	thread := []string{"connector", "hooks", "channel", "C1", "thread", "T1"}
	id := submit(t, s, "m1", "alpha", thread...)
	b.next(t).reply("alpha's private answer")
	waitState(t, s, id, StateSucceeded)

	submit(t, s, "m2", "beta", thread...)
	if h := b.next(t).spec.Request.History; len(h) != 0 {
		t.Fatalf("agent beta got agent alpha's history in the same thread: %+v", h)
	}
}

// putRunV2 writes r as schema versions 1 and 2 did: runs/, queue/ and
// deliveries/, no summaries or indexes.
func putRunV2(tx *bolt.Tx, r Run) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := tx.Bucket(bucketRuns).Put([]byte(r.ID), data); err != nil {
		return err
	}
	if r.State == StateQueued {
		if err := tx.Bucket(bucketQueue).Put(u64(r.Seq), []byte(r.ID)); err != nil {
			return err
		}
	}
	if Finished(r.State) && !r.Delivered {
		if err := tx.Bucket(bucketDeliveries).Put([]byte(r.ID), nil); err != nil {
			return err
		}
	}
	if r.MessageID != "" {
		return tx.Bucket(bucketMessages).Put([]byte(r.MessageID), []byte(r.ID))
	}
	return nil
}
