package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/berth-dev/berth/internal/config"
)

// fakeNotifier stands in for systemd's notify socket: it records every
// message and reports the watchdog interval it was given.
type fakeNotifier struct {
	watchdog time.Duration
	mu       sync.Mutex
	sent     []string
	notes    chan string
}

func newFakeNotifier(watchdog time.Duration) *fakeNotifier {
	return &fakeNotifier{watchdog: watchdog, notes: make(chan string, 256)}
}

func (n *fakeNotifier) Notify(state string) error {
	n.mu.Lock()
	n.sent = append(n.sent, state)
	n.mu.Unlock()
	n.notes <- state
	return nil
}

func (n *fakeNotifier) WatchdogInterval() (time.Duration, error) { return n.watchdog, nil }
func (n *fakeNotifier) Monotonic() string                        { return "4242" }

func (n *fakeNotifier) Sent() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.sent...)
}

// count is how many messages sent so far are exactly state.
func (n *fakeNotifier) count(state string) int {
	c := 0
	for _, s := range n.Sent() {
		if s == state {
			c++
		}
	}
	return c
}

// await returns the next message that starts with prefix.
func (n *fakeNotifier) await(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case s := <-n.notes:
			if strings.HasPrefix(s, prefix) {
				return s
			}
		case <-timeout:
			t.Fatalf("no %q notification within 10s; sent: %q", prefix, n.Sent())
		}
	}
}

// logBuffer collects JSON log lines; messages returns their texts, which is
// what plain journalctl and systemctl status show.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) messages() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var msgs []string
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	for sc.Scan() {
		var rec struct {
			Msg string `json:"msg"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) == nil {
			msgs = append(msgs, rec.Msg)
		}
	}
	return msgs
}

// messagesContaining returns the log texts that contain every part.
func (b *logBuffer) messagesContaining(parts ...string) []string {
	var out []string
	for _, m := range b.messages() {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(m, p)
		}
		if all {
			out = append(out, m)
		}
	}
	return out
}

func testLogger() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

// serving starts d.Serve and returns its result channel once the daemon
// told the notifier it is ready.
func serving(t *testing.T, ctx context.Context, d *Daemon, n *fakeNotifier) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() {
		done <- d.Serve(ctx)
		close(finished)
	}()
	n.await(t, "READY=1")
	t.Cleanup(func() {
		d.Quit()
		<-finished
	})
	return done
}

func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return within 10s")
		return nil
	}
}

// blockingRun is a work loop that runs until canceled and says when it has
// returned.
func blockingRun(returned *atomic.Bool) func(context.Context) error {
	return func(ctx context.Context) error {
		<-ctx.Done()
		returned.Store(true)
		return ctx.Err()
	}
}

func TestServeExitsNonZeroWithTheReasonWhenTheWorkLoopEnds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		runErr  error
		wantMsg string
	}{
		{name: "A_failing_work_loop_is_logged_with_its_error", runErr: errors.New("cannot reconcile runs: record 7 is undecodable"),
			wantMsg: "the work loop ended: cannot reconcile runs: record 7 is undecodable"},
		{name: "A_work_loop_that_returns_nil_unasked_is_a_failure_too", wantMsg: "the work loop ended: it returned without being asked to stop"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			log, logs := testLogger()
			n := newFakeNotifier(0)
			fail := make(chan struct{})
			d := New(Options{Name: "berth-test", Status: "testing",
				Run: func(context.Context) error {
					<-fail
					return tc.runErr
				},
				Seams: Seams{Logger: log, Notifier: n, Signals: make(chan os.Signal)}})
			done := serving(t, context.Background(), d, n)
			close(fail)
			err := result(t, done)
			if err == nil || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("Serve = %v, want an error saying %q", err, tc.wantMsg)
			}
			if code := ExitCode(log, "berth-test", err); code != 1 {
				t.Fatalf("exit status %d, want 1 so that systemd restarts the daemon", code)
			}
			if got := logs.messagesContaining(tc.wantMsg, "systemd restarts berth-test"); len(got) == 0 {
				t.Fatalf("the log does not say %q; it says %q", tc.wantMsg, logs.messages())
			}
			if s := n.await(t, "STOPPING=1"); !strings.Contains(s, tc.wantMsg) {
				t.Fatalf("STOPPING status %q does not say why", s)
			}
		})
	}
}

func TestServeStopsCleanlyWhenAskedTo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		stop    func(d *Daemon, sigs chan os.Signal, cancel context.CancelFunc)
		wantWhy string
	}{
		{name: "On_SIGTERM", stop: func(_ *Daemon, sigs chan os.Signal, _ context.CancelFunc) { sigs <- syscall.SIGTERM }, wantWhy: "signal terminated"},
		{name: "On_SIGINT", stop: func(_ *Daemon, sigs chan os.Signal, _ context.CancelFunc) { sigs <- syscall.SIGINT }, wantWhy: "signal interrupt"},
		{name: "On_Quit", stop: func(d *Daemon, _ chan os.Signal, _ context.CancelFunc) { d.Quit() }, wantWhy: "asked to stop"},
		{name: "When_its_context_ends", stop: func(_ *Daemon, _ chan os.Signal, cancel context.CancelFunc) { cancel() }, wantWhy: "asked to stop (context canceled)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			log, logs := testLogger()
			n := newFakeNotifier(0)
			sigs := make(chan os.Signal, 1)
			var returned atomic.Bool
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			d := New(Options{Name: "berth-test", Status: "testing", Run: blockingRun(&returned),
				Seams: Seams{Logger: log, Notifier: n, Signals: sigs}})
			done := serving(t, ctx, d, n)
			tc.stop(d, sigs, cancel)
			if err := result(t, done); err != nil {
				t.Fatalf("Serve = %v, want nil", err)
			}
			if !returned.Load() {
				t.Fatal("Serve returned before the work loop had finished")
			}
			if got := logs.messagesContaining("stopping: " + tc.wantWhy); len(got) == 0 {
				t.Fatalf("the log does not say why it stops (%q): %q", tc.wantWhy, logs.messages())
			}
			sent := n.Sent()
			if !strings.HasPrefix(sent[len(sent)-1], "STOPPING=1") {
				t.Fatalf("the last notification is %q, want STOPPING=1", sent[len(sent)-1])
			}
		})
	}
}

func TestServeExitsNonZeroWhenItCannotGoOn(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		wantMsg string
		setup   func(o *Options) (breakIt func())
	}{
		{name: "When_the_bus_connection_is_lost", wantMsg: "lost the D-Bus connection", setup: func(o *Options) func() {
			lost := make(chan struct{})
			o.BusLost = lost
			return func() { close(lost) }
		}},
		{name: "When_an_HTTP_listener_fails", wantMsg: "the HTTP listener on", setup: func(o *Options) func() {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				panic(err)
			}
			o.Listeners = []net.Listener{l}
			o.Handler = http.NotFoundHandler()
			return func() { l.Close() }
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			log, logs := testLogger()
			n := newFakeNotifier(0)
			var returned atomic.Bool
			opts := Options{Name: "berth-test", Run: blockingRun(&returned), Seams: Seams{Logger: log, Notifier: n, Signals: make(chan os.Signal)}}
			breakIt := tc.setup(&opts)
			done := serving(t, context.Background(), New(opts), n)
			breakIt()
			err := result(t, done)
			if err == nil || !strings.Contains(err.Error(), tc.wantMsg) || ExitCode(log, "berth-test", err) != 1 {
				t.Fatalf("Serve = %v, want an error saying %q and exit status 1", err, tc.wantMsg)
			}
			if !returned.Load() {
				t.Fatal("Serve returned before the work loop had finished")
			}
			if len(logs.messagesContaining(tc.wantMsg)) == 0 {
				t.Fatalf("the log does not say %q: %q", tc.wantMsg, logs.messages())
			}
		})
	}
}

func TestServeReloadsOnSIGHUP(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "berth.toml")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "berth.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "berth.d", "99-bad.toml")
	if err := os.WriteFile(bad, []byte("[scheduler]\nbogus_key = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		reload     func() error
		wantLog    string
		wantStatus string
	}{
		{name: "An_accepted_config_is_logged_and_serving_resumes", reload: func() error { return nil },
			wantLog: "config reloaded", wantStatus: "READY=1\nSTATUS=testing"},
		{name: "A_refused_config_names_file_line_and_key_in_the_message_text", reload: func() error {
			_, err := LoadConfig(path, nil)
			return err
		},
			wantLog:    "config refused, the running one keeps serving: " + bad + ":2: scheduler.bogus_key: unknown key",
			wantStatus: "READY=1\nSTATUS=testing (last reload refused: " + bad + ":2: scheduler.bogus_key: unknown key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			log, logs := testLogger()
			n := newFakeNotifier(0)
			sigs := make(chan os.Signal, 1)
			var returned atomic.Bool
			reloaded := make(chan struct{}, 1)
			d := New(Options{Name: "berth-test", Status: "testing", Run: blockingRun(&returned),
				Reload: func() error { defer func() { reloaded <- struct{}{} }(); return tc.reload() },
				Seams:  Seams{Logger: log, Notifier: n, Signals: sigs}})
			done := serving(t, context.Background(), d, n)
			sigs <- syscall.SIGHUP
			if got := n.await(t, "RELOADING=1"); got != "RELOADING=1\nMONOTONIC_USEC=4242" {
				t.Fatalf("reload announced as %q, want RELOADING=1 with MONOTONIC_USEC", got)
			}
			<-reloaded
			if got := n.await(t, "READY=1"); !strings.HasPrefix(got, tc.wantStatus) {
				t.Fatalf("after the reload the daemon said %q, want %q", got, tc.wantStatus)
			}
			if got := logs.messagesContaining(tc.wantLog); len(got) != 1 {
				t.Fatalf("want one log message %q, got %q", tc.wantLog, logs.messages())
			}
			if returned.Load() {
				t.Fatal("the work loop stopped on a reload")
			}
			sigs <- syscall.SIGTERM
			if err := result(t, done); err != nil {
				t.Fatalf("Serve after the reload = %v, want nil", err)
			}
		})
	}
}

// Not parallel: it sends real signals to the test process, which would kill
// it if Serve announced READY before its handlers were in place.
func TestServeIsReadyOnlyOnceItHandlesSignals(t *testing.T) {
	log, _ := testLogger()
	n := newFakeNotifier(0)
	var returned atomic.Bool
	reloaded := make(chan struct{}, 1)
	d := New(Options{Name: "berth-test", Run: blockingRun(&returned),
		Reload: func() error { reloaded <- struct{}{}; return nil },
		Seams:  Seams{Logger: log, Notifier: n}})
	done := make(chan error, 1)
	go func() { done <- d.Serve(context.Background()) }()
	n.await(t, "READY=1")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	n.await(t, "RELOADING=1")
	<-reloaded
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatalf("Serve after SIGTERM = %v, want nil", err)
	}
	if !returned.Load() {
		t.Fatal("the work loop was not stopped")
	}
}

func TestServeExitsIdleOnlyAfterTheIdleTime(t *testing.T) {
	t.Parallel()
	const after = time.Minute
	clock := clockwork.NewFakeClock()
	start := clock.Now()
	log, logs := testLogger()
	n := newFakeNotifier(0)
	checked := make(chan struct{})
	var returned atomic.Bool
	d := New(Options{Name: "berth-test", Run: blockingRun(&returned), IdleAfter: after,
		Busy:  func() bool { checked <- struct{}{}; return false },
		Seams: Seams{Logger: log, Notifier: n, Clock: clock, Signals: make(chan os.Signal)}})
	done := serving(t, context.Background(), d, n)
	if err := clock.BlockUntilContext(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	for clock.Since(start) < after {
		clock.Advance(IdleCheckInterval(after))
		select {
		case <-checked:
		case err := <-done:
			t.Fatalf("Serve returned %v after %s, before the idle time of %s", err, clock.Since(start), after)
		}
	}
	err := result(t, done)
	if !errors.Is(err, ErrIdle) || ExitCode(log, "berth-test", err) != ExitIdle {
		t.Fatalf("Serve = %v, want ErrIdle (exit status %d)", err, ExitIdle)
	}
	if len(logs.messagesContaining("stopping: idle for 1m0s")) == 0 {
		t.Fatalf("the idle exit is not logged: %q", logs.messages())
	}
	if !returned.Load() {
		t.Fatal("Serve returned before the work loop had finished")
	}
}

func TestWatchdogIsPingedOnlyWhileTheWorkLoopProgresses(t *testing.T) {
	t.Parallel()
	const interval = 10 * time.Second
	// Each step advances the clock by interval/2 (one watchdog check); stuck
	// says whether the work loop makes progress during that step.
	tests := []struct {
		name        string
		noProgress  bool // no Progress function at all
		stuck       []bool
		wantPings   int
		wantStuck   int // "stuck" log messages
		wantResumed int // "progresses again" log messages
	}{
		{name: "Pings_at_every_check_while_the_loop_progresses", stuck: []bool{false, false, false, false}, wantPings: 4},
		{name: "Stops_pinging_once_no_progress_for_longer_than_the_interval_and_says_so_once",
			stuck: []bool{true, true, true, true, true}, wantPings: 2, wantStuck: 1},
		{name: "Pings_again_once_the_loop_progresses_again",
			stuck: []bool{true, true, true, false, false}, wantPings: 4, wantStuck: 1, wantResumed: 1},
		{name: "Without_progress_reports_pings_while_the_loop_runs", noProgress: true, stuck: []bool{true, true, true}, wantPings: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := clockwork.NewFakeClock()
			log, logs := testLogger()
			n := newFakeNotifier(interval)
			var progress atomic.Pointer[time.Time]
			start := clock.Now()
			progress.Store(&start)
			checked := make(chan struct{})
			var returned atomic.Bool
			opts := Options{Name: "berth-test", Status: "testing", Run: blockingRun(&returned),
				Seams: Seams{Logger: log, Notifier: n, Clock: clock, Signals: make(chan os.Signal)}}
			if !tc.noProgress {
				opts.Progress = func() time.Time {
					checked <- struct{}{}
					return *progress.Load()
				}
			}
			d := New(opts)
			done := serving(t, context.Background(), d, n)
			for i, stuck := range tc.stuck {
				if !stuck {
					now := clock.Now().Add(interval / 4)
					progress.Store(&now)
				}
				clock.Advance(interval / 2)
				if tc.noProgress {
					n.await(t, "WATCHDOG=1")
					continue
				}
				select {
				case <-checked:
				case <-time.After(10 * time.Second):
					t.Fatalf("no watchdog check at step %d", i)
				}
			}
			// Every check has finished once Serve has returned.
			d.Quit()
			if err := result(t, done); err != nil {
				t.Fatal(err)
			}
			if got := n.count("WATCHDOG=1"); got != tc.wantPings {
				t.Fatalf("%d watchdog pings, want %d; sent %q", got, tc.wantPings, n.Sent())
			}
			stuckMsgs := logs.messagesContaining("the work loop has been stuck for 15s", "no more watchdog pings")
			if len(stuckMsgs) != tc.wantStuck {
				t.Fatalf("%d messages about the stuck loop, want %d: %q", len(stuckMsgs), tc.wantStuck, logs.messages())
			}
			if got := len(logs.messagesContaining("progresses again")); got != tc.wantResumed {
				t.Fatalf("%d messages about the loop resuming, want %d: %q", got, tc.wantResumed, logs.messages())
			}
			if tc.wantStuck > 0 {
				if got := n.Sent(); !containsPrefix(got, "STATUS=the work loop has been stuck") {
					t.Fatalf("systemctl status is not told the loop is stuck: %q", got)
				}
			}
		})
	}
}

func containsPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

func TestLoadConfigNamesFileLineAndKeyInTheMessageText(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "berth.toml")
	if err := os.WriteFile(path, []byte("[agent_defaults]\n\n[[agents]]\nid = \"ops\"\n[agents.container_mode]\nnetwork = \"host\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	log, logs := testLogger()
	cfg, err := LoadConfig(path, log)
	var errs config.Errors
	if cfg != nil || !errors.As(err, &errs) {
		t.Fatalf("LoadConfig = %v, %v; want config errors", cfg, err)
	}
	want := "config refused: " + path + ":6: agents[0].container_mode.network: "
	if got := logs.messagesContaining(want); len(got) != 1 {
		t.Fatalf("want one message starting %q, got %q", want, logs.messages())
	}
}

func TestServeExitsNonZeroWhenTheWorkLoopFailsWhileStopping(t *testing.T) {
	t.Parallel()
	log, _ := testLogger()
	n := newFakeNotifier(0)
	sigs := make(chan os.Signal, 1)
	d := New(Options{Name: "berth-test",
		Run: func(ctx context.Context) error {
			<-ctx.Done()
			return errors.New("cannot put the running runs back in the queue: disk full")
		},
		Seams: Seams{Logger: log, Notifier: n, Signals: sigs}})
	done := serving(t, context.Background(), d, n)
	sigs <- syscall.SIGTERM
	err := result(t, done)
	want := "the work loop failed while stopping: cannot put the running runs back in the queue: disk full"
	if err == nil || err.Error() != want || ExitCode(log, "berth-test", err) != 1 {
		t.Fatalf("Serve = %v, want %q and exit status 1", err, want)
	}
}
