package intake

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/fulldisk"
	"github.com/berth-dev/berth/services/intake/connector"
)

// gatedSubmitter answers like the scheduler once open is closed; until
// then its Submits wait.
type gatedSubmitter struct {
	*countingSubmitter
	open chan struct{}
}

func (g gatedSubmitter) Submit(ctx context.Context, msg busapi.Submission) (string, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return g.countingSubmitter.Submit(ctx, msg)
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func fullDiskBody(t *testing.T, id string) []byte {
	return mustJSON(t, map[string]string{"id": id, "channel": "ops", "author": "ann", "text": "hello " + id})
}

func TestAFullStateDiskRefusesNewMessagesWith503AndLosesNoneAccepted(t *testing.T) {
	t.Parallel()
	dir := fulldisk.Mount(t, 8<<20)
	var logs syncBuffer
	sub := gatedSubmitter{newCountingSubmitter(), make(chan struct{})}
	s, err := New(testConfig(""), dir,
		WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))),
		WithRetryDelays(10*time.Millisecond, 50*time.Millisecond),
		WithSubmitter(sub))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Close()
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	runService(t, s)
	now := time.Now()

	// Accepted before the disk fills: their Submits wait, so they are
	// pending while it is full.
	var accepted []string
	for i := range 3 {
		id := fmt.Sprintf("before-%d", i)
		if code, out := post(t, s, signedRequest("hooks", fullDiskBody(t, id), testSecret, now)); code != 202 {
			t.Fatalf("POST %s with room: %d %v", id, code, out)
		}
		accepted = append(accepted, id)
	}

	filler := fulldisk.Fill(t, dir)
	// bbolt may still fit a few messages into pages its file already has;
	// those are accepted and kept. Then it must refuse.
	var refused string
	var refusedHeader string
	var refusedBody map[string]string
	for i := 0; refused == ""; i++ {
		if i == 200 {
			t.Fatal("200 POSTs on a full disk were all accepted")
		}
		id := fmt.Sprintf("during-%03d", i)
		r := signedRequest("hooks", fullDiskBody(t, id), testSecret, now)
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, r)
		switch w.Code {
		case 202:
			accepted = append(accepted, id)
		case 503:
			refused, refusedHeader = id, w.Header().Get("Retry-After")
			refusedBody = map[string]string{"body": w.Body.String()}
		default:
			t.Fatalf("POST %s on a full disk: %d %s", id, w.Code, w.Body.String())
		}
	}
	if !strings.Contains(refusedBody["body"], "state disk is full") {
		t.Errorf("503 body %q does not say the disk is full", refusedBody["body"])
	}
	if refusedHeader == "" {
		t.Error("503 has no Retry-After")
	}
	if _, found, err := s.store.message("hooks", refused); err != nil || found {
		t.Errorf("refused message stored: found=%v err=%v", found, err)
	}
	// A storm of refused POSTs is one log line, not one per request.
	for i := range 20 {
		r := signedRequest("hooks", fullDiskBody(t, fmt.Sprintf("storm-%d", i)), testSecret, now)
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, r)
		if w.Code != 503 {
			t.Fatalf("POST %d of the storm: %d %s", i, w.Code, w.Body.String())
		}
	}
	// A platform connector's event is not acknowledged either.
	err = s.Accept(context.Background(), connector.Message{Connector: "hooks", ID: "from-a-platform", Channel: "ops", Author: "bob", Text: "hi"})
	if err == nil {
		t.Error("Accept on a full disk returned nil: the platform would not deliver the event again")
	}
	if code, out := getHealth(t, s); code != 200 || out["status"] != "state disk full" || out["state_dir"] != dir {
		t.Errorf("GET /healthz on a full disk: %d %v", code, out)
	}
	if n := strings.Count(logs.String(), "state disk is full"); n != 1 {
		t.Errorf("the full disk was logged %d times, want once:\n%s", n, logs.String())
	}
	if line := logs.String(); !strings.Contains(line, "state_dir="+dir) || !strings.Contains(line, "free_bytes=") {
		t.Errorf("the log line does not name the state directory and its free space:\n%s", line)
	}

	// The scheduler answers while the disk is still full: the marks fail
	// and are retried.
	close(sub.open)
	eventually(t, "the messages accepted before the fill were submitted", func() bool {
		return sub.callsFor(busapi.MessageKey("hooks", accepted[0])) > 0
	})

	filler.Free(t)
	if code, out := post(t, s, signedRequest("hooks", fullDiskBody(t, refused), testSecret, now)); code != 202 {
		t.Fatalf("POST %s again once there is room: %d %v", refused, code, out)
	}
	accepted = append(accepted, refused)
	for _, id := range accepted {
		eventually(t, id+" is submitted and marked so", func() bool {
			m, found, err := s.store.message("hooks", id)
			return err == nil && found && m.State == stateSubmitted
		})
	}
	if code, out := getHealth(t, s); code != 200 || out["status"] != "ok" {
		t.Errorf("GET /healthz once writes resumed: %d %v", code, out)
	}
	if !strings.Contains(logs.String(), "writes resumed") {
		t.Errorf("no log line says writing resumed:\n%s", logs.String())
	}
}

func getHealth(t *testing.T, s *Service) (int, map[string]string) {
	t.Helper()
	return post(t, s, httptest.NewRequest("GET", "/healthz", nil))
}
