package intake

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/bus"
)

func TestReplayOfASignedRequestWithoutIDRunsNothingAgain(t *testing.T) {
	t.Parallel()
	s, _ := newTestService(t, testConfig(""))
	sub := newCountingSubmitter()
	s.submitter.Store(&submitterBox{sub})
	runService(t, s)

	body := mustJSON(t, map[string]string{"channel": "ops", "author": "a", "text": "/sh rm -rf important"})
	ts := time.Now()
	code1, out1 := post(t, s, signedRequest("hooks", body, testSecret, ts))
	// An attacker who captured the request sends it again, unchanged.
	code2, out2 := post(t, s, signedRequest("hooks", body, testSecret, ts))
	if code1 != http.StatusAccepted || code2 != http.StatusAccepted || out1["id"] == "" || out1["id"] != out2["id"] {
		t.Fatalf("replay: %d %v then %d %v, want two 202 with the same id", code1, out1, code2, out2)
	}
	// The same body signed a second later is a new message (the sender meant it).
	_, out3 := post(t, s, signedRequest("hooks", body, testSecret, ts.Add(time.Second)))
	if out3["id"] == out1["id"] {
		t.Fatalf("a newly signed request got the replayed id %q", out3["id"])
	}
	eventually(t, "both messages are submitted", func() bool {
		return sub.callsFor("hooks/"+out1["id"]) >= 1 && sub.callsFor("hooks/"+out3["id"]) >= 1
	})
	if n := sub.callsFor("hooks/" + out1["id"]); n != 1 {
		t.Fatalf("the replayed message was submitted %d times, want 1", n)
	}
}

// refusingSubmitter answers like a scheduler that no longer knows the agent.
type refusingSubmitter struct {
	mu    sync.Mutex
	calls int
}

func (r *refusingSubmitter) Submit(context.Context, map[string]string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	return "", bus.NewError(bus.ErrInvalidArgument, "unknown agent %q", "ops-agent")
}

func TestMessageRefusedForGoodGetsAnErrorReplyInsteadOfEndlessRetries(t *testing.T) {
	t.Parallel()
	rs := newReplyServer(t, 0)
	s, _ := newTestService(t, testConfig(rs.URL))
	sub := &refusingSubmitter{}
	s.submitter.Store(&submitterBox{sub})
	runService(t, s)

	body := mustJSON(t, map[string]string{"id": "m1", "channel": "ops", "author": "a", "text": "hi"})
	if code, _ := post(t, s, signedRequest("hooks", body, testSecret, time.Now())); code != http.StatusAccepted {
		t.Fatalf("post: %d", code)
	}
	eventually(t, "the sender gets an error reply", func() bool { _, ok := rs.counts(); return ok > 0 })
	rs.mu.Lock()
	got := rs.accepted[0]
	rs.mu.Unlock()
	if got.ID != "m1" || got.State != "failed" || got.Error != `unknown agent "ops-agent"` {
		t.Fatalf("error reply %+v", got)
	}
	time.Sleep(300 * time.Millisecond) // several retry periods at the test's 10-100ms back-off
	sub.mu.Lock()
	calls := sub.calls
	sub.mu.Unlock()
	if calls != 1 {
		t.Fatalf("a message refused for good was submitted %d times, want 1", calls)
	}
	if inbox, _, err := s.store.pendingCounts(); err != nil || inbox != 0 {
		t.Fatalf("%d messages still pending (err %v)", inbox, err)
	}
}
