package intake

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
)

const testSecret = "s3cret-for-tests"

// testConfig has a webhook connector "hooks" that routes channel "ops" to
// agent "ops-agent" and everything else to "helper", and a connector
// "strict" that routes only channel "ops".
func testConfig(replyURL string) *config.Config {
	return &config.Config{
		Connectors: []config.Connector{
			{ID: "hooks", Type: "webhook", Secret: testSecret, ReplyURL: replyURL, DefaultAgent: "helper"},
			{ID: "strict", Type: "webhook", Secret: testSecret},
			{ID: "chat", Type: "meepachat", Secret: testSecret, DefaultAgent: "helper"},
		},
		Bindings: []config.Binding{
			{Connector: "hooks", ChannelID: "ops", Agent: "ops-agent"},
			{Connector: "strict", ChannelID: "ops", Agent: "ops-agent"},
		},
	}
}

// newTestService opens a service on a fresh state directory; it is closed
// when the test ends.
func newTestService(t *testing.T, cfg *config.Config, opts ...Option) (*Service, string) {
	t.Helper()
	dir := t.TempDir()
	opts = append([]Option{
		WithLogger(slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		WithRetryDelays(10*time.Millisecond, 100*time.Millisecond),
	}, opts...)
	s, err := New(cfg, dir, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() }) // a second Close is harmless
	return s, filepath.Join(dir, DBName)
}

// runService runs s until the test ends.
func runService(t *testing.T, s *Service) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10s of cancel")
		}
	})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// signedRequest builds POST /hooks/<connector> signed with secret at ts.
func signedRequest(connector string, body []byte, secret string, ts time.Time) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/hooks/"+connector, bytes.NewReader(body))
	SetSignature(r.Header, []byte(secret), ts, body)
	return r
}

func post(t *testing.T, s *Service, r *http.Request) (int, map[string]string) {
	t.Helper()
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	var out map[string]string
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatalf("response is not a JSON object: %q", w.Body.String())
	}
	return w.Code, out
}

// countEntries opens the database file (the service must be closed) and
// counts the keys of every bucket that holds messages or replies.
func countEntries(t *testing.T, path string) map[string]int {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatalf("cannot open %s: %v", path, err)
	}
	defer db.Close()
	counts := map[string]int{}
	err = db.View(func(tx *bolt.Tx) error {
		for _, top := range [][]byte{bucketInbox, bucketOutbox} {
			b := tx.Bucket(top)
			if b == nil {
				continue
			}
			err := b.ForEachBucket(func(name []byte) error {
				counts[string(top)+"/"+string(name)] = countKeys(b.Bucket(name))
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("cannot count entries: %v", err)
	}
	return counts
}

func countKeys(b *bolt.Bucket) int {
	n := 0
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		n++
	}
	return n
}

// eventually polls cond until it holds or 10s have passed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// countingSubmitter records Submit calls and answers like the scheduler:
// one run per id. It fails while failing is set.
type countingSubmitter struct {
	mu      sync.Mutex
	calls   map[string]int
	runs    map[string]string
	failing bool
}

func newCountingSubmitter() *countingSubmitter {
	return &countingSubmitter{calls: map[string]int{}, runs: map[string]string{}}
}

func (c *countingSubmitter) Submit(_ context.Context, sub busapi.Submission) (string, error) {
	msg := sub.Wire()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[msg["id"]]++
	if c.failing {
		return "", io.ErrUnexpectedEOF
	}
	if run, ok := c.runs[msg["id"]]; ok {
		return run, nil
	}
	run := "run-" + strconv.Itoa(len(c.runs)+1)
	c.runs[msg["id"]] = run
	return run, nil
}

func (c *countingSubmitter) totalCalls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, calls := range c.calls {
		n += calls
	}
	return n
}

func (c *countingSubmitter) callsFor(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[id]
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// passes is told of every loop pass of a service (Service.passed).
type passes struct{ ch chan string }

// passHook installs a pass recorder on s; call it before Run.
func passHook(s *Service) *passes {
	p := &passes{ch: make(chan string, 4096)}
	s.passed = func(loop string) {
		select {
		case p.ch <- loop:
		default:
		}
	}
	return p
}

// drain forgets the passes seen so far.
func (p *passes) drain() {
	for {
		select {
		case <-p.ch:
		default:
			return
		}
	}
}

// waitFor returns after the next pass of loop, failing the test after 10s.
func (p *passes) waitFor(t *testing.T, loop string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-p.ch:
			if got == loop {
				return
			}
		case <-timeout:
			t.Fatalf("timed out waiting for a pass of the %s loop", loop)
		}
	}
}

// wireSubmissions are subs as SubmitBatch carries them, for fakes that read
// them by key.
func wireSubmissions(subs []busapi.Submission) []map[string]string {
	out := make([]map[string]string, len(subs))
	for i, s := range subs {
		out[i] = s.Wire()
	}
	return out
}
