package intake

// Benchmarks of the front door (docs/benchmarks.md, scripts/bench.sh).
// Figures, not assertions: each reports its baseline from the same run.
//
//	go test ./services/intake -run '^$' -bench . -benchtime 1x

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/berth-dev/berth/internal/busapi"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// benchReps is how many times each figure is measured (median reported),
// the variants interleaved.
func benchReps() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_REPS")); err == nil && n > 0 {
		return n
	}
	return 3
}

const acceptWindow = 1500 * time.Millisecond // how long each accept measurement sends

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// sendFor POSTs signed webhook messages from senders concurrent clients
// (keep-alive) to url for d and returns how many were answered 202 and how
// long that took.
func sendFor(b *testing.B, url string, senders int, d time.Duration) (int, time.Duration) {
	b.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: senders, MaxConnsPerHost: senders}}
	defer client.CloseIdleConnections()
	var (
		next, ok atomic.Int64
		failed   atomic.Value
		wg       sync.WaitGroup
	)
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36)
	start := time.Now()
	stop := start.Add(d)
	for range senders {
		wg.Go(func() {
			for time.Now().Before(stop) {
				id := prefix + "-" + strconv.FormatInt(next.Add(1), 10)
				body := []byte(`{"id":"` + id + `","channel":"ops","author":"ada","text":"deploy the thing"}`)
				req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				SetSignature(req.Header, []byte(testSecret), time.Now(), body)
				resp, err := client.Do(req)
				if err != nil {
					failed.Store(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					failed.Store(fmt.Errorf("status %s", resp.Status))
					return
				}
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatalf("a sender failed: %v", err)
	}
	return int(ok.Load()), time.Since(start)
}

// naiveAccept is the baseline: the same checks as a webhook (signature,
// JSON) and one bbolt commit per message.
func naiveAccept(db *bolt.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err == nil {
			err = verifySignature(r.Header, []byte(testSecret), time.Now(), body)
		}
		var m webhookMessage
		if err == nil {
			err = json.Unmarshal(body, &m)
		}
		if err == nil {
			err = db.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucketIfNotExists(bucketInbox)
				if err != nil {
					return err
				}
				return b.Put([]byte("hooks/"+m.ID), body)
			})
		}
		if err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeJSON(w, http.StatusAccepted, map[string]string{"id": m.ID})
	})
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// BenchmarkAccept: durable accepts per second at 10 and 50 concurrent
// senders, intake (group commit) beside a naive one-commit-per-message
// server, over real HTTP on loopback.
func BenchmarkAccept(b *testing.B) {
	for _, senders := range []int{10, 50} {
		b.Run(fmt.Sprintf("senders=%d", senders), func(b *testing.B) {
			var naive, intake, perMsg []float64
			for range benchReps() {
				// Baseline.
				db, err := bolt.Open(filepath.Join(b.TempDir(), "naive.db"), 0o600, nil)
				if err != nil {
					b.Fatal(err)
				}
				srv := httptest.NewServer(naiveAccept(db))
				n, took := sendFor(b, srv.URL+"/hooks/hooks", senders, acceptWindow)
				srv.Close()
				db.Close()
				naive = append(naive, float64(n)/took.Seconds())

				// Intake.
				s, err := New(testConfig(""), b.TempDir(), WithLogger(quietLogger))
				if err != nil {
					b.Fatal(err)
				}
				c0, _ := s.store.commitStats()
				srv = httptest.NewServer(s.Handler())
				n, took = sendFor(b, srv.URL+"/hooks/hooks", senders, acceptWindow)
				srv.Close()
				c1, _ := s.store.commitStats()
				s.Close()
				intake = append(intake, float64(n)/took.Seconds())
				perMsg = append(perMsg, float64(c1-c0)/float64(n))
			}
			b.ReportMetric(median(naive), "naive_msg/s")
			b.ReportMetric(median(intake), "intake_msg/s")
			b.ReportMetric(median(intake)/median(naive), "x_naive")
			b.ReportMetric(median(perMsg), "commits/msg")
		})
	}
}

// instantSubmitter answers every Submit at once with a run id.
type instantSubmitter struct{ n atomic.Int64 }

func (i *instantSubmitter) Submit(context.Context, busapi.Submission) (string, error) {
	return "run-" + strconv.FormatInt(i.n.Add(1), 10), nil
}

func (i *instantSubmitter) SubmitBatch(ctx context.Context, subs []busapi.Submission) ([]string, []error, error) {
	ids := make([]string, len(subs))
	for k, msg := range subs {
		ids[k], _ = i.Submit(ctx, msg)
	}
	return ids, make([]error, len(subs)), nil
}

// fillBacklog accepts n pending messages for connector hooks, all for
// agent ops-agent.
func fillBacklog(b *testing.B, s *Service, n int) { fillBacklogOf(b, s, n, 1) }

// fillBacklogOf accepts n pending messages for connector hooks, for agents
// agent-00, agent-01, … in turn (ops-agent when agents is 1).
func fillBacklogOf(b *testing.B, s *Service, n, agents int) {
	b.Helper()
	var wg sync.WaitGroup
	var failed atomic.Value
	ids := make(chan int, n)
	for i := range n {
		ids <- i
	}
	close(ids)
	for range 64 {
		wg.Go(func() {
			for i := range ids {
				agent := "ops-agent"
				if agents > 1 {
					agent = fmt.Sprintf("agent-%02d", i%agents)
				}
				_, _, err := s.store.accept(inboxEntry{Connector: "hooks", ID: fmt.Sprintf("b-%06d", i), Channel: "ops", Author: "ada", Text: "deploy the thing", Agent: agent, ReceivedAt: time.Now()})
				if err != nil {
					failed.Store(err)
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
}

// handOff runs s (its backlog filled) until nothing is pending and returns
// the messages per second and the commits per message it took.
func handOff(b *testing.B, s *Service, n int) (float64, float64) {
	b.Helper()
	c0, _ := s.store.commitStats()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- s.Run(ctx) }()
	for {
		if in, _ := s.store.pendingCounts(); in == 0 {
			break
		}
		if time.Since(start) > 2*time.Minute {
			b.Fatal("the backlog was not handed on within 2 minutes")
		}
		time.Sleep(time.Millisecond)
	}
	took := time.Since(start)
	c1, _ := s.store.commitStats()
	cancel()
	<-done
	return float64(n) / took.Seconds(), float64(c1-c0) / float64(n)
}

// BenchmarkHandOff: one agent's backlog reaching a Submitter that answers
// at once, in batches (SubmitBatch) beside one Submit at a time (the
// baseline, on a smaller backlog).
func BenchmarkHandOff(b *testing.B) {
	for _, tc := range []struct {
		name    string
		window  int
		backlog int
	}{
		{"serial", 1, 2000},
		{"pipelined", submitWindow, 10000},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var rates, perMsg []float64
			for range benchReps() {
				var sub Submitter = &instantSubmitter{}
				if tc.window == 1 {
					sub = submitOnly{sub}
				}
				s, err := New(testConfig(""), b.TempDir(), WithLogger(quietLogger), WithSubmitter(sub))
				if err != nil {
					b.Fatal(err)
				}
				s.submitWindow = tc.window
				fillBacklog(b, s, tc.backlog)
				rate, commits := handOff(b, s, tc.backlog)
				s.Close()
				rates = append(rates, rate)
				perMsg = append(perMsg, commits)
			}
			b.ReportMetric(median(rates), "msg/s")
			b.ReportMetric(median(perMsg), "commits/msg")
		})
	}
}

// downSubmitter is a scheduler that is not there.
type downSubmitter struct{ calls atomic.Int64 }

func (d *downSubmitter) Submit(context.Context, busapi.Submission) (string, error) {
	d.calls.Add(1)
	return "", errors.New("org.freedesktop.DBus.Error.ServiceUnknown: the name is not activatable")
}

// BenchmarkSchedulerDown: a backlog of 10,000 while every Submit fails,
// retried for 3 s with delays of 5 to 50 ms (many retry rounds): commits
// per accepted message (the accept included) and Submits per pass.
func BenchmarkSchedulerDown(b *testing.B) {
	const backlog = 10000
	var perMsg, perPass []float64
	for range benchReps() {
		sub := &downSubmitter{}
		s, err := New(testConfig(""), b.TempDir(), WithLogger(quietLogger), WithSubmitter(sub), WithRetryDelays(5*time.Millisecond, 50*time.Millisecond))
		if err != nil {
			b.Fatal(err)
		}
		var passes atomic.Int64
		s.passed = func(loop string) {
			if loop == "forward/hooks" {
				passes.Add(1)
			}
		}
		fillBacklog(b, s, backlog)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_ = s.Run(ctx)
		cancel()
		commits, _ := s.store.commitStats()
		s.Close()
		perMsg = append(perMsg, float64(commits)/backlog)
		perPass = append(perPass, float64(sub.calls.Load())/float64(max(passes.Load(), 1)))
	}
	b.ReportMetric(median(perMsg), "commits/msg")
	b.ReportMetric(median(perPass), "submits/pass")
}
