package ctl

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
)

// usage is `berthctl usage [--agent A] [--since 7d] [--json]`: what each
// agent spent on providers per day (UTC), from the scheduler's counters
// (docs/admin/usage.md).
func (c *cli) usage(args []string) error {
	fs := newFlags("usage")
	agent := fs.String("agent", "", "one agent only")
	since := fs.String("since", "7d", "how far back: 7d, 36h, or a day 2006-01-02")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return usageError("%v", err)
	}
	if fs.NArg() != 0 {
		return usageError("usage: berthctl usage [--agent A] [--since 7d] [--json]")
	}
	from, err := sinceTime(*since, time.Now())
	if err != nil {
		return usageError("--since: %v", err)
	}
	sched, err := c.scheduler()
	if err != nil {
		return err
	}
	days, err := sched.Usage(context.Background(), *agent, from)
	if err != nil {
		return fmt.Errorf("cannot read usage: %w", err)
	}
	if *asJSON {
		if days == nil {
			days = []busapi.UsageDay{}
		}
		return writeJSON(c.out, days)
	}
	return writeUsageDays(c.out, days)
}

// sinceTime reads --since: a number of days ("7d"), a Go duration
// ("36h") or a day (2006-01-02, UTC).
func sinceTime(s string, now time.Time) (time.Time, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil || days < 0 {
			return time.Time{}, fmt.Errorf("%q is not a number of days like 7d", s)
		}
		// Today counts as one of them.
		day := now.UTC().Truncate(24*time.Hour).AddDate(0, 0, -max(days-1, 0))
		return day, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is not 7d, 36h or 2006-01-02", s)
}

// writeUsageDays prints one line per agent and day, and each agent's sum.
func writeUsageDays(w io.Writer, days []busapi.UsageDay) error {
	if len(days) == 0 {
		_, err := fmt.Fprintln(w, "no provider calls in that time")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AGENT\tDAY\tCALLS\tINPUT\tCACHED\tOUTPUT\tCOST\tREFUSED")
	var sum busapi.Usage
	flush := func(agent string) {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%d\n", agent, "total", sum.Calls, sum.Input, sum.Cached, sum.Output, cost(sum.Cost), sum.Refused)
		sum = busapi.Usage{}
	}
	for i, d := range days {
		u := d.Usage
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%d\n", d.Agent, d.Day, u.Calls, u.Input, u.Cached, u.Output, cost(u.Cost), u.Refused)
		sum.Calls, sum.Input, sum.Cached, sum.Output, sum.Cost, sum.Refused = sum.Calls+u.Calls, sum.Input+u.Input, sum.Cached+u.Cached, sum.Output+u.Output, sum.Cost+u.Cost, sum.Refused+u.Refused
		if i == len(days)-1 || days[i+1].Agent != d.Agent {
			flush(d.Agent)
		}
	}
	return tw.Flush()
}

// cost is an amount of the admin's currency, as [providers.X.prices] set it.
func cost(v float64) string {
	if v == 0 {
		return "0"
	}
	if v < 0.01 {
		return strconv.FormatFloat(v, 'f', 6, 64)
	}
	return strconv.FormatFloat(v, 'f', 4, 64)
}

// writeUsage prints a run's provider usage (runs show): totals, each
// model, and the budget that stopped a call.
func writeUsage(w io.Writer, run busapi.Run) {
	u, err := run.RunUsage()
	if err != nil || u == nil {
		return
	}
	fmt.Fprintf(w, "\nusage: %d calls, %d input (%d cached), %d output tokens, cost %s\n", u.Calls, u.Input, u.Cached, u.Output, cost(u.Cost))
	for _, m := range u.Models {
		fmt.Fprintf(w, "  %s %s: %d calls, %d input (%d cached), %d output, cost %s\n", m.Provider, m.Model, m.Calls, m.Input, m.Cached, m.Output, cost(m.Cost))
	}
	if u.Unpriced > 0 {
		fmt.Fprintf(w, "  (%d calls of models without [providers.X.prices] count no cost)\n", u.Unpriced)
	}
	if u.Budget != "" {
		fmt.Fprintf(w, "  BUDGET %s refused %d calls: %s\n", u.Budget, u.Refused, u.BudgetReason)
	}
}
