package scheduler

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

// Run with scripts/bench-scheduler.sh; figures in docs/benchmarks.md.

var benchSizes = []int{1000, 10000, 100000}

// benchRunningRuns is how many runs each restart finds left running.
const benchRunningRuns = 10

var (
	seededMu sync.Mutex
	seeded   = map[int]string{} // size → a directory holding a seeded scheduler.db
)

// benchRun is the nth seeded run: mostly succeeded and delivered, 5% failed,
// 1% queued, across 10 agents, with a message and a reply of a few hundred
// bytes and one tool call.
func benchRun(n int, at time.Time) Run {
	r := Run{
		ID: newRunID(at), MessageID: fmt.Sprintf("bench/%d", n), Agent: fmt.Sprintf("agent%d", n%10),
		Connector: "hook", Channel: "C1", Author: "ann",
		Text:  strings.Repeat("how do I rotate the logs? ", 8),
		State: StateSucceeded, Reply: strings.Repeat("Use logrotate with a daily rule. ", 15),
		ToolCalls: []byte(`[{"name":"shell","args":{"cmd":"ls /var/log"},"output":"syslog\nauth.log\n"}]`),
		Attempts:  1, CreatedAt: at, StartedAt: at, FinishedAt: at.Add(time.Second), Delivered: true, Seq: uint64(n + 1),
	}
	switch {
	case n%20 == 1:
		r.State, r.Reason, r.Error = StateFailed, isolation.ReasonTimeout, "no response within 5m0s"
	case n%100 == 2:
		r.State, r.Reply, r.ToolCalls, r.FinishedAt, r.Delivered = StateQueued, "", nil, time.Time{}, false
	}
	return r
}

// seededDir returns a directory with a scheduler.db of size runs (made once
// per size, in big transactions).
func seededDir(b *testing.B, size int) string {
	b.Helper()
	seededMu.Lock()
	defer seededMu.Unlock()
	if dir, ok := seeded[size]; ok {
		return dir
	}
	dir, err := os.MkdirTemp("", "berth-bench-")
	if err != nil {
		b.Fatal(err)
	}
	st, err := openStore(filepath.Join(dir, DBName))
	if err != nil {
		b.Fatal(err)
	}
	defer st.close()
	st.db.NoSync = true // seeding only; what is measured syncs
	base := time.Now().Add(-time.Duration(size) * time.Second)
	for start := 0; start < size; start += 10000 {
		err := st.db.Update(func(tx *bolt.Tx) error {
			for n := start; n < min(start+10000, size); n++ {
				r := benchRun(n, base.Add(time.Duration(n)*time.Second))
				if err := putRun(tx, r); err != nil {
					return err
				}
				if err := messagesBucket(tx).Put([]byte(r.MessageID), []byte(r.ID)); err != nil {
					return err
				}
			}
			return queueBucket(tx).SetSequence(uint64(size + 1))
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	if err := st.db.Sync(); err != nil {
		b.Fatal(err)
	}
	seeded[size] = dir
	return dir
}

func benchConfig() *config.Config {
	cfg := config.Defaults()
	cfg.Scheduler.MaxConcurrentRuns = 4
	for i := range 10 {
		cfg.Agents = append(cfg.Agents, config.AgentSettings{ID: fmt.Sprintf("agent%d", i)})
	}
	return cfg
}

func fileSize(b *testing.B, dir string) float64 {
	b.Helper()
	info, err := os.Stat(filepath.Join(dir, DBName))
	if err != nil {
		b.Fatal(err)
	}
	return float64(info.Size())
}

// usedSize is the part of the file bbolt has in use (the rest is free pages
// and room it grew into ahead of need).
func usedSize(b *testing.B, s *Service) float64 {
	b.Helper()
	var used int64
	err := s.store.db.View(func(tx *bolt.Tx) error {
		st := s.store.db.Stats()
		used = tx.Size() - int64(st.FreePageN+st.PendingPageN)*int64(s.store.db.Info().PageSize)
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return float64(used)
}

// BenchmarkScheduler measures, at each store size: Submit, the first page of
// ListRuns (all runs, and filtered by state), and a restart (open, migrate
// check, reconcile of benchRunningRuns interrupted runs). db-bytes is the
// file size.
func BenchmarkScheduler(b *testing.B) {
	b.Cleanup(func() {
		seededMu.Lock()
		defer seededMu.Unlock()
		for size, dir := range seeded {
			os.RemoveAll(dir)
			delete(seeded, size)
		}
	})
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("runs=%d", size), func(b *testing.B) {
			dir := seededDir(b, size)
			b.Run("Submit", func(b *testing.B) {
				s, err := New(benchConfig(), dir, Options{Logger: quietLog})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				prefix := fmt.Sprintf("submit/%d/", time.Now().UnixNano())
				b.ResetTimer()
				for i := range b.N {
					if _, err := s.Submit(busapi.Submission{MessageID: fmt.Sprint(prefix, i), Agent: "agent1", Text: "hello"}); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(fileSize(b, dir), "db-bytes")
				b.ReportMetric(usedSize(b, s), "db-used-bytes")
			})
			for _, bc := range []struct {
				name   string
				filter RunFilter
			}{
				{"ListRunsFirstPage", RunFilter{}},
				{"ListRunsFailed", RunFilter{State: StateFailed}},
			} {
				b.Run(bc.name, func(b *testing.B) {
					s, err := New(benchConfig(), dir, Options{Logger: quietLog})
					if err != nil {
						b.Fatal(err)
					}
					defer s.Close()
					b.ResetTimer()
					for range b.N {
						runs, err := s.ListRuns(bc.filter)
						if err != nil || len(runs) != defaultListLimit {
							b.Fatalf("ListRuns = %d runs, %v", len(runs), err)
						}
					}
				})
			}
			b.Run("Restart", func(b *testing.B) {
				for range b.N {
					b.StopTimer()
					markRunning(b, dir, benchRunningRuns)
					b.StartTimer()
					s, err := New(benchConfig(), dir, Options{Logger: quietLog})
					if err != nil {
						b.Fatal(err)
					}
					if err := s.reconcile(context.Background()); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					s.Close()
					b.StartTimer()
				}
			})
		})
	}
}

// markRunning puts n queued runs in state running, as a crash leaves them.
func markRunning(b *testing.B, dir string, n int) {
	b.Helper()
	st, err := openStore(filepath.Join(dir, DBName))
	if err != nil {
		b.Fatal(err)
	}
	defer st.close()
	err = st.db.Update(func(tx *bolt.Tx) error {
		ids := runIDsInState(tx, StateQueued)
		for _, id := range ids[:min(n, len(ids))] {
			r, _, err := getRun(tx, id)
			if err != nil {
				return err
			}
			r.State, r.Attempts = StateRunning, 0
			if err := putRun(tx, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRetentionSteadySize writes 2000 runs per simulated day, with
// finished runs kept 7 days, and reports the file size once the window is
// full (day 8) and 20 days later: a store under retention stops growing.
func BenchmarkRetentionSteadySize(b *testing.B) {
	for range b.N {
		dir := b.TempDir()
		clock := clockwork.NewFakeClock()
		cfg := benchConfig()
		cfg.Retention = config.Retention{FinishedRuns: 7 * 24 * time.Hour, RunsPerAgent: 1 << 30, IdleConversation: 7 * 24 * time.Hour}
		s, err := New(cfg, dir, Options{Logger: quietLog, Clock: clock})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		var full float64
		for day := 1; day <= 28; day++ {
			err := s.store.db.Update(func(tx *bolt.Tx) error {
				for range 2000 {
					r := benchRun(n, clock.Now())
					if r.State == StateQueued {
						r.State, r.FinishedAt, r.Delivered = StateSucceeded, clock.Now(), true
					}
					n++
					if err := putRun(tx, r); err != nil {
						return err
					}
					if err := messagesBucket(tx).Put([]byte(r.MessageID), []byte(r.ID)); err != nil {
						return err
					}
					clock.Advance(time.Second)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			clock.Advance(24*time.Hour - 2000*time.Second)
			if rep := s.prune(context.Background()); rep.Err != nil {
				b.Fatal(rep.Err)
			}
			if day == 8 {
				full = fileSize(b, dir)
			}
		}
		b.ReportMetric(full, "db-bytes-window-full")
		b.ReportMetric(fileSize(b, dir), "db-bytes-20-days-later")
		b.ReportMetric(usedSize(b, s), "db-used-bytes-20-days-later")
		s.Close()
	}
}

// instantBackend finishes every run at once with a reply.
type instantBackend struct{}

func (instantBackend) Name() string { return "landlock" }

func (instantBackend) Run(_ context.Context, spec isolation.Spec) (isolation.Result, error) {
	return isolation.Result{Response: agentproto.Response{Version: 1, RunID: spec.RunID, Reply: "done"}}, nil
}

func (instantBackend) Kill(context.Context, string) error { return nil }

// instantIntake takes every reply at once.
type instantIntake struct{}

func (instantIntake) Deliver(context.Context, busapi.Reply) error { return nil }

// lastTxID is the id of scheduler.db's last committed transaction: commits
// made so far, whoever made them.
func lastTxID(b *testing.B, s *Service) int {
	b.Helper()
	var id int
	if err := s.store.db.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil }); err != nil {
		b.Fatal(err)
	}
	return id
}

// BenchmarkRunsThroughTheScheduler: 64 concurrent submitters (intake's
// window) hand 2,000 messages for 10 agents to Service.Submit while the
// dispatcher runs them (a backend that finishes at once) and delivers the
// replies (an intake that takes them at once). Submits/s is until the last
// Submit returned, runs/s until the last reply was marked delivered;
// commits/run counts every commit of scheduler.db (transaction ids).
func BenchmarkRunsThroughTheScheduler(b *testing.B) {
	const messages, submitters = 2000, 64
	for range b.N {
		s, err := New(benchConfig(), b.TempDir(), Options{
			Backends:  map[string]isolation.Backend{"landlock": instantBackend{}},
			Deliverer: instantIntake{},
			Getenv:    func(string) string { return "" },
			Logger:    quietLog,
		})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		tx0 := lastTxID(b, s)
		ids := make(chan int, messages)
		for i := range messages {
			ids <- i
		}
		close(ids)
		start := time.Now()
		var wg sync.WaitGroup
		for range submitters {
			wg.Go(func() {
				for i := range ids {
					msg := busapi.Submission{MessageID: fmt.Sprint(i), Agent: fmt.Sprint("agent", i%10), Connector: "hooks", Channel: "C1", Text: "deploy the thing"}
					if _, err := s.Submit(msg); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		submitted := time.Since(start)
		for {
			var left int
			err := s.store.db.View(func(tx *bolt.Tx) error {
				left = queueBucket(tx).Stats().KeyN + deliveriesBucket(tx).Stats().KeyN + len(runIDsInState(tx, StateRunning))
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			if left == 0 {
				break
			}
			if time.Since(start) > 2*time.Minute {
				b.Fatal("the runs did not end within 2 minutes")
			}
			time.Sleep(2 * time.Millisecond)
		}
		ended := time.Since(start)
		commits := lastTxID(b, s) - tx0
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		s.Close()
		b.ReportMetric(messages/submitted.Seconds(), "submits/s")
		b.ReportMetric(messages/ended.Seconds(), "runs/s")
		b.ReportMetric(float64(commits)/messages, "commits/run")
	}
}
