package ctl

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/services/scheduler"
)

func TestUsageAndBudgetOutputMatchTheGoldenFiles(t *testing.T) {
	t.Parallel()
	u := busapi.Usage{Calls: 3, Input: 1200, Cached: 1000, Output: 300, Cost: 0.0042, Refused: 1, Budget: "tokens_per_day",
		BudgetReason: "the agent's budget tokens_per_day (1500) is used up for today (UTC)",
		Models:       []busapi.ModelUsage{{Provider: "openai", Model: "gpt-4o-mini", Calls: 3, Input: 1200, Cached: 1000, Output: 300, Cost: 0.0042}}}
	tests := []struct {
		name  string
		write func(*bytes.Buffer) error
	}{
		{"usage.txt", func(w *bytes.Buffer) error {
			return writeUsageDays(w, []busapi.UsageDay{
				{Agent: "alpha", Day: "2026-11-30", Usage: busapi.Usage{Calls: 10, Input: 50000, Output: 4000, Cost: 1.25}},
				{Agent: "alpha", Day: "2026-12-01", Usage: u},
				{Agent: "beta", Day: "2026-12-01", Usage: busapi.Usage{Calls: 1, Input: 10, Output: 2}},
			})
		}},
		{"budget.txt", func(w *bytes.Buffer) error {
			return writeBudgets(w, []busapi.Budget{
				{Agent: "alpha", Day: "2026-12-01", TokensPerDay: 1500, CostPerRun: 0.5, Raised: []string{"tokens_per_day"}, TokensUsed: 1500, CostUsed: 0.0042, Calls: 3, Refused: 1},
				{Agent: "beta", Day: "2026-12-01", CostPerDay: 5, RequestsPerMinute: 30, TokensUsed: 12, Calls: 1},
			})
		}},
		{"runs_show_usage.txt", func(w *bytes.Buffer) error {
			printRun(w, busapi.Run{
				RunHead: busapi.RunHead{ID: "20261201T093000_1_aa", Agent: "alpha", State: busapi.StateSucceeded, Attempts: 1, Backend: "landlock", CreatedAt: at},
				Usage:   busapi.Output{Text: u.Wire()},
				Reply:   busapi.Output{Text: "done\n\n(berth: a model call was stopped: " + u.BudgetReason + ")"},
			})
			return nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tt.write(&b); err != nil {
				t.Fatal(err)
			}
			golden(t, tt.name, b.Bytes())
		})
	}
}

func TestSinceReadsDaysDurationsAndDates(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"1d":         time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC),
		"7d":         time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC),
		"36h":        now.Add(-36 * time.Hour),
		"2026-11-01": time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
	} {
		if got, err := sinceTime(in, now); err != nil || !got.Equal(want) {
			t.Errorf("sinceTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"a week", "-3d", "7x"} {
		if _, err := sinceTime(bad, now); err == nil {
			t.Errorf("sinceTime(%q) took it", bad)
		}
	}
}

// berthctl usage and budget talk to a real scheduler on a private bus; its
// counters are what a run's calls left in scheduler.db.
func TestUsageAndBudgetOverTheBus(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	today := time.Now().UTC()
	// The scheduler's usage/ bucket as its runs' calls leave it.
	db, err := bolt.Open(filepath.Join(dir, scheduler.DBName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("usage"))
		if err != nil {
			return err
		}
		for _, d := range []struct {
			ago   int
			calls int
		}{{0, 2}, {3, 5}, {10, 9}} {
			v, _ := json.Marshal(map[string]any{"calls": d.calls, "input": 100 * d.calls, "output": 10 * d.calls, "cost": 0.5})
			if err := b.Put([]byte("alpha\x00"+today.AddDate(0, 0, -d.ago).Format(time.DateOnly)), v); err != nil {
				return err
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	c, _, out, errOut := runsSchedulerOnBus(t, dir)
	if err := c.usage([]string{"--since", "7d"}); err != nil {
		t.Fatalf("usage: %v %s", err, errOut)
	}
	got := out.String()
	if !strings.Contains(got, today.Format(time.DateOnly)) || !strings.Contains(got, today.AddDate(0, 0, -3).Format(time.DateOnly)) ||
		strings.Contains(got, today.AddDate(0, 0, -10).Format(time.DateOnly)) || !strings.Contains(strings.Join(strings.Fields(got), " "), "alpha total 7 700") {
		t.Fatalf("usage --since 7d:\n%s", got)
	}
	out.Reset()
	if err := c.budget([]string{"set", "alpha", "tokens_per_day", "5000"}); err != nil {
		t.Fatalf("budget set: %v", err)
	}
	out.Reset()
	if err := c.budget([]string{"show", "alpha"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "220 / 5000*") {
		t.Fatalf("budget show after the raise:\n%s", out)
	}
	if err := c.budget([]string{"set", "alpha", "tokens_per_week", "1"}); err == nil || !strings.Contains(err.Error(), "unknown budget key") {
		t.Fatalf("an unknown key: %v", err)
	}
	if err := c.budget([]string{"set", "nobody", "tokens_per_day", "1"}); err == nil {
		t.Fatal("a budget of an unknown agent was set")
	}
}
