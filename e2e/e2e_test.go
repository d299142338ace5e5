// Package e2e runs the whole suite the way systemd does — berth-intake
// socket-activated by systemd-socket-activate, berth-scheduler D-Bus-activated
// on a private system bus that loads units/dbus — and checks what a user would
// notice: signed messages in, replies out, nothing lost, nothing run twice,
// and agents that cannot read what they must not.
package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/testkit/devstack"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

var (
	binDir   string
	buildErr error
	baseDir  string
)

func TestMain(m *testing.M) {
	code := func() int {
		var err error
		// 0755 all the way down: agents run as nobody and must exec berth-agent.
		baseDir, err = os.MkdirTemp("", "be-") // short: egress socket paths must fit a Unix address
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(baseDir)
		_ = os.Chmod(baseDir, 0o755)
		binDir = filepath.Join(baseDir, "bin")
		_, file, _, _ := runtime.Caller(0)
		buildErr = devstack.Build(filepath.Join(filepath.Dir(file), ".."), binDir)
		return m.Run()
	}()
	os.Exit(code)
}

const secret = "e2e-webhook-secret"

// replySink is the chat platform: it verifies each reply's signature and
// records it by message id.
type replySink struct {
	srv   *httptest.Server
	mu    sync.Mutex
	byID  map[string][]map[string]any
	tries map[string]int // POSTs per message id, refused ones included
	count int
	bad   int
}

func newReplySink(t *testing.T) *replySink {
	s := &replySink{byID: map[string][]map[string]any{}, tries: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_, want := devstack.SignAt([]byte(secret), r.Header.Get("X-Berth-Timestamp"), body)
		s.mu.Lock()
		defer s.mu.Unlock()
		if !hmac.Equal([]byte(want), []byte(r.Header.Get("X-Berth-Signature"))) {
			s.bad++
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var reply map[string]any
		if err := json.Unmarshal(body, &reply); err != nil {
			s.bad++
			http.Error(w, "bad json", http.StatusBadRequest)
			return
		}
		id, _ := reply["id"].(string)
		// Like a flaky platform, refuse every reply's first POST: intake must
		// retry until a 2xx.
		s.tries[id]++
		if s.tries[id] == 1 {
			http.Error(w, "try again later", http.StatusServiceUnavailable)
			return
		}
		s.byID[id] = append(s.byID[id], reply)
		s.count++
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// wait returns once every id has a reply, failing the test after timeout.
func (s *replySink) wait(t *testing.T, timeout time.Duration, ids ...string) map[string]map[string]any {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s.mu.Lock()
		got := map[string]map[string]any{}
		for _, id := range ids {
			if rs := s.byID[id]; len(rs) > 0 {
				got[id] = rs[0]
			}
		}
		s.mu.Unlock()
		if len(got) == len(ids) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("replies for %d of %d messages after %v", len(got), len(ids), timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *replySink) attempts(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tries[id]
}

func (s *replySink) replies(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID[id])
}

type suite struct {
	*devstack.Stack
	sink *replySink

	// clients is the one bus connection of the typed clients (scheduler,
	// intake): tests poll through them, and a connection each would
	// exhaust the bus's connections per user. Closed with the suite.
	clientsOnce sync.Once
	clients     *dbus.Conn
	clientsErr  error
}

// clientConn is the suite's shared connection for typed clients.
func (s *suite) clientConn(t *testing.T) *dbus.Conn {
	t.Helper()
	s.clientsOnce.Do(func() { s.clients, s.clientsErr = s.Conn() })
	if s.clientsErr != nil {
		t.Fatalf("cannot connect to the suite's bus: %v", s.clientsErr)
	}
	return s.clients
}

// stop ends the suite: its clients' connection, then the stack.
func (s *suite) stop() {
	if s.clients != nil {
		s.clients.Close()
	}
	s.Stop()
}

type agentSpec struct {
	id    string
	extra string // TOML lines inside the [[agents]] table
}

// start brings up a suite with one binding channel_id=<agent id> per agent.
func start(t *testing.T, agents []agentSpec, env ...string) *suite {
	t.Helper()
	testenv.NeedRoot(t)
	_, err := exec.LookPath("systemd-socket-activate")
	testenv.Need(t, err == nil, "systemd-socket-activate is not installed")
	if buildErr != nil {
		t.Fatalf("cannot build berth: %v", buildErr)
	}
	sink := newReplySink(t)
	return launch(t, sink, suiteConfig(agents, sink.srv.URL+"/replies"), env, secret) // the webhook secret never reaches a log
}

// suiteConfig is the config start gives a suite: the agents, each bound to
// the webhook channel of its own id, replies to replyURL.
func suiteConfig(agents []agentSpec, replyURL string) string {
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "[providers]\nprimary = \"local\"\n\n")
	// Small workspace images: the suite makes many agents at once.
	fmt.Fprintf(&cfg, "[agent_defaults]\nworkspace_quota = \"64m\"\n\n")
	for _, a := range agents {
		fmt.Fprintf(&cfg, "[[agents]]\nid = %q\nmax_iterations = 4\n%s\n\n", a.id, a.extra)
	}
	fmt.Fprintf(&cfg, "[intake]\ndefault_agent = %q\n\n", agents[0].id)
	fmt.Fprintf(&cfg, "[[connectors]]\nid = \"hooks\"\ntype = \"webhook\"\nsecret = %q\nreply_url = %q\n\n", secret, replyURL)
	for _, a := range agents {
		fmt.Fprintf(&cfg, "[[bindings]]\nconnector = \"hooks\"\nchannel_id = %q\nagent = %q\n\n", a.id, a.id)
	}
	fmt.Fprintf(&cfg, "[scheduler]\nmax_concurrent_runs = 4\ndefault_timeout_seconds = 60\nrun_as = \"nobody\"\nagent_binary = %q\n", filepath.Join(binDir, "berth-agent"))

	return cfg.String()
}

// launch starts a suite with cfg; when the test ends it stops it, fails the
// test if any of secrets reached intake's or the bus's log, and shows those
// logs if the test failed.
func launch(t *testing.T, sink *replySink, cfg string, env []string, secrets ...string) *suite {
	t.Helper()
	return launchIn(t, suiteDir(t), sink, cfg, env, secrets...)
}

// suiteDir is a new directory for a suite (short: socket paths live in it).
func suiteDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(baseDir, "s-")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// launchIn is launch in dir, which the caller may have prepared (a small
// disk mounted for a service's state, say).
func launchIn(t *testing.T, dir string, sink *replySink, cfg string, env []string, secrets ...string) *suite {
	t.Helper()
	st, err := devstack.Start(devstack.Options{BinDir: binDir, Dir: dir, Config: cfg, Env: env})
	if err != nil {
		t.Fatalf("cannot start the suite: %v", err)
	}
	s := &suite{Stack: st, sink: sink}
	t.Cleanup(func() {
		s.stop()
		for _, p := range []string{st.IntakeLog, st.BusLog} {
			b, _ := os.ReadFile(p)
			for _, secret := range secrets {
				if strings.Contains(string(b), secret) {
					t.Errorf("a secret is in %s", p)
				}
			}
			if t.Failed() {
				t.Logf("%s:\n%s", p, tail(b, 6000))
			}
		}
	})
	return s
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// post sends a signed message and returns the status and the id intake gave.
func (s *suite) post(t *testing.T, msg map[string]string) (int, string) {
	t.Helper()
	m := make(map[string]any, len(msg))
	for k, v := range msg {
		m[k] = v
	}
	return s.postAny(t, m)
}

func (s *suite) mustPost(t *testing.T, channel, text string) string {
	t.Helper()
	status, id := s.post(t, map[string]string{"channel": channel, "author": "tester", "text": text})
	if status != http.StatusAccepted || id == "" {
		t.Fatalf("POST %q: status %d id %q, want 202 and an id", text, status, id)
	}
	return id
}

func (s *suite) conn(t *testing.T) *dbus.Conn {
	t.Helper()
	c, err := s.Conn()
	if err != nil {
		t.Fatalf("cannot connect to the suite's bus: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// scheduler and intake are typed clients of the suite's services, on the
// suite's shared connection.
func (s *suite) scheduler(t *testing.T) busapi.Scheduler { return busapi.NewScheduler(s.clientConn(t)) }
func (s *suite) intake(t *testing.T) busapi.Intake       { return busapi.NewIntake(s.clientConn(t)) }

func (s *suite) listRuns(t *testing.T, filter busapi.ListFilter) []busapi.RunSummary {
	t.Helper()
	runs, err := s.scheduler(t).ListRuns(context.Background(), filter)
	if err != nil {
		t.Fatalf("ListRuns: %v", err)
	}
	return runs
}

// getRun is the full run record as GetRun returns it (ListRuns gives summaries).
func (s *suite) getRun(t *testing.T, id string) busapi.Run {
	t.Helper()
	run, err := s.scheduler(t).GetRun(context.Background(), id)
	if err != nil {
		t.Fatalf("GetRun %s: %v", id, err)
	}
	return run
}

// intakeStatus is intake's properties (intake must be running).
func (s *suite) intakeStatus(t *testing.T) busapi.IntakeStatus {
	t.Helper()
	st, err := s.intake(t).Properties(context.Background())
	if err != nil {
		t.Fatalf("intake's properties: %v", err)
	}
	return st
}

func (s *suite) berthctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "berthctl"), args...)
	cmd.Env = append(os.Environ(), "DBUS_SYSTEM_BUS_ADDRESS="+s.Bus.Address)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func text(reply map[string]any) string {
	s, _ := reply["text"].(string)
	return s
}
