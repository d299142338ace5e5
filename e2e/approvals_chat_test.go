package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testkit/testdocker"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// An approval is decided in the chat by one of the agent's [[approvers]]
// (here a webhook's author, as its signed body names it): the question
// carries its choices; anyone else's "approve" is refused with a note and
// changes nothing; the approver's "approve … for conversation" lets the
// tool's request through, and a later run in the same conversation is not
// asked again. Both backends.
func TestApprovalsAnApproverDecidesInTheChat(t *testing.T) {
	t.Parallel()
	for _, backend := range []struct{ name, extra string }{{"landlock", ""}, {"container", containerAgent}} {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			if backend.name == "container" {
				testdocker.Engine(t)
			}
			approversOn(t, backend.extra)
		})
	}
}

func approversOn(t *testing.T, extra string) {
	host, hits := askedUpstream(t)
	testenv.NeedRoot(t)
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	sink := newReplySink(t)
	cfg := askerConfig(sink, fmt.Sprintf("[agents.egress]\nask = [%q]\n%s", "GET "+host, extra))
	cfg += "\n[[approvers]]\nagent = \"asker\"\nusers = [\"webhook:alice\"]\n"
	s := launch(t, sink, cfg, nil, secret)
	say := func(author, thread, text string) string {
		t.Helper()
		status, id := s.post(t, map[string]string{"channel": "asker", "thread": thread, "author": author, "text": text})
		if status != http.StatusAccepted || id == "" {
			t.Fatalf("POST %q as %s: status %d", text, author, status)
		}
		return id
	}
	fetch := func(n int) string { return fmt.Sprintf(`/tool web_fetch {"url":"http://%s/charge?n=%d"}`, host, n) }

	id := say("tester", "t1", fetch(1))
	ap := s.pendingApproval(t, host)
	question := s.sink.question(t, time.Minute, id)
	q, _ := question["approval"].(map[string]any)
	if q["id"] != ap.ID || q["what"] != ap.What || fmt.Sprint(q["choices"]) != "[allow_once allow_conversation deny]" {
		t.Fatalf("the question's approval = %v, want %s's id, what and choices", q, ap.ID)
	}
	if !strings.Contains(text(question), "approve "+ap.ID) {
		t.Errorf("the question does not say how to answer: %q", text(question))
	}

	// Not an approver: refused with a note, nothing decided.
	no := say("mallory", "t1", "approve "+ap.ID)
	if got := text(s.sink.answerOf(t, no)); !strings.Contains(got, "webhook:mallory is not one of agent asker's approvers") {
		t.Fatalf("mallory's approve was answered %q", got)
	}
	if still := s.pendingApproval(t, host); still.ID != ap.ID {
		t.Fatalf("after mallory's approve the pending approval is %+v", still)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the upstream got %d requests after a refused approve", n)
	}

	// The approver, for the conversation.
	yes := say("alice", "t1", "approve "+ap.ID+" for conversation")
	if got := text(s.sink.answerOf(t, yes)); !strings.Contains(got, "Allowed for this conversation by webhook:alice") {
		t.Fatalf("alice's approve was answered %q", got)
	}
	reply := s.sink.answer(t, time.Minute, id)
	if got := text(reply); reply["state"] != "succeeded" || !strings.Contains(got, "the-upstream-answered") {
		t.Fatalf("reply after the approve: state %v %q", reply["state"], got)
	}
	if rec := s.runRecord(t, reply).Egress.Text; !strings.Contains(rec, "approved by webhook:alice") {
		t.Errorf("the run record does not name the approver: %s", rec)
	}

	// A later run in the same conversation is not asked again; one in
	// another thread is (the control).
	later := say("tester", "t1", fetch(2))
	if got := text(s.sink.answer(t, time.Minute, later)); !strings.Contains(got, "the-upstream-answered") {
		t.Fatalf("the later run's reply: %q", got)
	}
	if qs := s.sink.questions(later); qs != 0 {
		t.Errorf("the later run in the conversation was asked %d times", qs)
	}
	other := say("tester", "t2", fetch(3))
	again := s.pendingApproval(t, host) // the only one pending
	if _, err := s.scheduler(t).DecideApproval(context.Background(), again.ID, "deny"); err != nil {
		t.Fatal(err)
	}
	if got := text(s.sink.answer(t, time.Minute, other)); !strings.Contains(got, "403") {
		t.Errorf("the other thread's denied run: %q", got)
	}
}

// answerOf waits for the reply to a message that ran nothing (a decision).
func (s *replySink) answerOf(t *testing.T, id string) map[string]any {
	t.Helper()
	return s.first(t, time.Minute, id, func(runID string) bool { return strings.HasPrefix(runID, "decided-") })
}

// questions counts the approval questions asked in reply to message id.
func (s *replySink) questions(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.byID[id] {
		if runID, _ := r["run_id"].(string); strings.HasPrefix(runID, "ask-") {
			n++
		}
	}
	return n
}
