package intake

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/services/intake/connector"
)

// commitGate holds every commit of a store until the test releases it: each
// commit announces itself on entered (with the number of writes queued
// behind it) and then commits on a nil from release, or rolls back and fails
// with the error it gets.
type commitGate struct {
	entered   chan int
	release   chan error
	committed atomic.Int64 // commits that reached the disk
}

func holdCommits(t *testing.T, s *Service) *commitGate {
	g := &commitGate{entered: make(chan int, 16), release: make(chan error)}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) }) // a failed test holds nothing
	hook := func(tx *bolt.Tx, _ int) error {
		var err error
		select {
		case g.entered <- s.store.w.Waiting():
			select {
			case err = <-g.release:
			case <-stop:
				err = errors.New("test ended")
			}
		case <-stop:
			err = errors.New("test ended")
		}
		if err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		g.committed.Add(1)
		return nil
	}
	s.store.w.SetCommitHook(hook)
	return g
}

func (g *commitGate) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no commit started within 10s")
	}
}

// ackWriter records whether the commit had reached the disk when the
// response status was written.
type ackWriter struct {
	*httptest.ResponseRecorder
	gate              *commitGate
	committedAtAnswer int64
	answered          chan struct{}
}

func (w *ackWriter) WriteHeader(code int) {
	w.committedAtAnswer = w.gate.committed.Load()
	w.ResponseRecorder.WriteHeader(code)
	close(w.answered)
}

func hookBody(id string) []byte {
	return []byte(`{"id":"` + id + `","channel":"ops","author":"ada","text":"hi"}`)
}

func TestAnAcceptIsAnsweredOnlyAfterTheCommitThatHoldsIt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		connector string
		accept    func(t *testing.T, s *Service, gate *commitGate) (answered <-chan struct{}, committedAtAnswer func() int64)
	}{
		{"A_webhook_POST_gets_its_202_after_the_commit", "hooks", func(t *testing.T, s *Service, gate *commitGate) (<-chan struct{}, func() int64) {
			w := &ackWriter{ResponseRecorder: httptest.NewRecorder(), gate: gate, answered: make(chan struct{})}
			go s.Handler().ServeHTTP(w, signedRequest("hooks", hookBody("held-1"), testSecret, time.Now()))
			return w.answered, func() int64 {
				if w.Code != http.StatusAccepted {
					t.Errorf("status = %d, want 202: %s", w.Code, w.Body)
				}
				return w.committedAtAnswer
			}
		}},
		{"A_platform_event_is_acknowledged_after_the_commit", "alpha", func(t *testing.T, s *Service, gate *commitGate) (<-chan struct{}, func() int64) {
			answered := make(chan struct{})
			var at int64
			go func() {
				err := s.Accept(context.Background(), connector.Message{Connector: "alpha", ID: "held-1", Channel: "C1", Author: "ada", Text: "hi"})
				at = gate.committed.Load()
				if err != nil {
					t.Errorf("Accept = %v, want nil", err)
				}
				close(answered)
			}()
			return answered, func() int64 { return at }
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakePlatforms(nil)
			cfg := platformConfig()
			cfg.Connectors = append(cfg.Connectors, testConfig("").Connectors[0])
			cfg.Bindings = append(cfg.Bindings, testConfig("").Bindings[0])
			s, _ := startPlatforms(t, cfg, f)
			gate := holdCommits(t, s)
			answered, committedAtAnswer := tc.accept(t, s, gate)

			gate.waitEntered(t) // the commit holding the message has begun
			select {
			case <-answered:
				t.Fatal("the sender was answered while the commit holding its message had not reached the disk")
			default:
			}
			gate.release <- nil
			<-answered
			if at := committedAtAnswer(); at != 1 {
				t.Fatalf("%d commits had reached the disk when the sender was answered, want 1", at)
			}
			if _, found, err := s.store.message(tc.connector, "held-1"); err != nil || !found {
				t.Fatalf("acknowledged message is not stored: found=%v err=%v", found, err)
			}
		})
	}
}

func TestMessagesArrivingDuringACommitShareTheNextOne(t *testing.T) {
	t.Parallel()
	s, _ := newTestService(t, testConfig(""))
	gate := holdCommits(t, s)
	h := s.Handler()
	codes := make(chan int, 21)
	postOne := func(id string) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, signedRequest("hooks", hookBody(id), testSecret, time.Now()))
		codes <- w.Code
	}
	go postOne("first")
	gate.waitEntered(t)
	for i := range 20 {
		go postOne(fmt.Sprintf("next-%d", i))
	}
	eventually(t, "20 messages wait for the next commit", func() bool { return s.store.w.Waiting() == 20 })
	gate.release <- nil // the first commit
	gate.waitEntered(t) // the second holds all 20
	gate.release <- nil
	for range 21 {
		if code := <-codes; code != http.StatusAccepted {
			t.Fatalf("status %d, want 202", code)
		}
	}
	if commits, writes := s.store.commitStats(); commits != 2 || writes != 21 {
		t.Fatalf("21 messages took %d commits (%d writes), want 2 commits", commits, writes)
	}
	if inbox, _ := s.store.pendingCounts(); inbox != 21 {
		t.Fatalf("inbox holds %d pending messages, want 21", inbox)
	}
}

func TestAFailedGroupCommitFailsEveryAcceptInItAndStoresNothing(t *testing.T) {
	t.Parallel()
	f := newFakePlatforms(nil)
	cfg := platformConfig()
	cfg.Connectors = append(cfg.Connectors, testConfig("").Connectors[0])
	cfg.Bindings = append(cfg.Bindings, testConfig("").Bindings[0])
	s, path := startPlatforms(t, cfg, f)
	gate := holdCommits(t, s)
	h := s.Handler()

	type outcome struct {
		what string
		err  error
	}
	outcomes := make(chan outcome, 11)
	postOne := func(id string) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, signedRequest("hooks", hookBody(id), testSecret, time.Now()))
		var err error
		if w.Code != http.StatusAccepted {
			err = fmt.Errorf("status %d", w.Code)
		}
		outcomes <- outcome{"POST " + id, err}
	}
	acceptOne := func(id string) {
		err := s.Accept(context.Background(), connector.Message{Connector: "alpha", ID: id, Channel: "C1", Author: "ada", Text: "hi"})
		outcomes <- outcome{"Accept " + id, err}
	}
	go postOne("first")
	gate.waitEntered(t)
	for i := range 5 {
		go postOne(fmt.Sprintf("lost-%d", i))
		go acceptOne(fmt.Sprintf("lost-%d", i))
	}
	eventually(t, "10 accepts wait for the next commit", func() bool { return s.store.w.Waiting() == 10 })
	gate.release <- nil // the first commit succeeds
	if o := <-outcomes; o.err != nil {
		t.Fatalf("%s: %v, want accepted", o.what, o.err)
	}
	gate.waitEntered(t)
	gate.release <- errors.New("disk full") // the second fails
	for range 10 {
		if o := <-outcomes; o.err == nil {
			t.Errorf("%s was acknowledged although its commit failed", o.what)
		}
	}
	if inbox, _ := s.store.pendingCounts(); inbox != 1 {
		t.Fatalf("InboxPending = %d after a failed commit, want 1", inbox)
	}

	// The platforms retry: every message is stored once.
	s.store.w.SetCommitHook(nil)
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() { postOne(fmt.Sprintf("lost-%d", i)) })
		wg.Go(func() { acceptOne(fmt.Sprintf("lost-%d", i)) })
	}
	wg.Wait()
	for range 10 {
		if o := <-outcomes; o.err != nil {
			t.Fatalf("retry %s: %v", o.what, o.err)
		}
	}
	s.Close()
	if n := countEntries(t, path)["inbox/messages"]; n != 11 {
		t.Fatalf("inbox holds %d messages, want 11", n)
	}
}
