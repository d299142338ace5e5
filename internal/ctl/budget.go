package ctl

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/berth-dev/berth/internal/busapi"
)

// budget is `berthctl budget [show [AGENT]] [--json]` and `berthctl
// budget set AGENT KEY VALUE`: the agents' [agents.budget] as it holds now
// with today's spending, and a key changed live (docs/admin/usage.md).
func (c *cli) budget(args []string) error {
	if len(args) > 0 && args[0] == "set" {
		if len(args) != 4 {
			return usageError("usage: berthctl budget set AGENT tokens_per_day|cost_per_day|cost_per_run|requests_per_minute VALUE|default")
		}
		sched, err := c.scheduler()
		if err != nil {
			return err
		}
		agent, key, value := args[1], args[2], args[3]
		if err := sched.SetBudget(context.Background(), agent, key, value); err != nil {
			return fmt.Errorf("cannot set the budget of %s: %w", agent, err)
		}
		if value == "default" {
			fmt.Fprintf(c.out, "%s of %s is berth.toml's again; its live runs have it now\n", key, agent)
		} else {
			fmt.Fprintf(c.out, "%s of %s is %s (0: no limit) until set to default; its live runs have it now\n", key, agent, value)
		}
		return nil
	}
	if len(args) > 0 && args[0] == "show" {
		args = args[1:]
	}
	fs := newFlags("budget")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return usageError("%v", err)
	}
	if fs.NArg() > 1 {
		return usageError("usage: berthctl budget [show] [--json] [AGENT] | budget set AGENT KEY VALUE")
	}
	sched, err := c.scheduler()
	if err != nil {
		return err
	}
	list, err := sched.GetBudgets(context.Background(), fs.Arg(0))
	if err != nil {
		return fmt.Errorf("cannot read budgets: %w", err)
	}
	if *asJSON {
		if list == nil {
			list = []busapi.Budget{}
		}
		return writeJSON(c.out, list)
	}
	return writeBudgets(c.out, list)
}

// writeBudgets prints each agent's limits with what it used today; a
// limit raised live is marked with *.
func writeBudgets(w io.Writer, list []busapi.Budget) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AGENT\tDAY\tTOKENS TODAY\tCOST TODAY\tCOST/RUN\tREQ/MIN\tCALLS\tREFUSED")
	for _, b := range list {
		raised := func(key, s string) string {
			for _, r := range b.Raised {
				if r == key {
					return s + "*"
				}
			}
			return s
		}
		limit := func(used, limit string, set bool) string {
			if !set {
				return used + " / -"
			}
			return used + " / " + limit
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", b.Agent, b.Day,
			raised("tokens_per_day", limit(fmt.Sprint(b.TokensUsed), fmt.Sprint(b.TokensPerDay), b.TokensPerDay > 0)),
			raised("cost_per_day", limit(cost(b.CostUsed), cost(b.CostPerDay), b.CostPerDay > 0)),
			raised("cost_per_run", orDash(b.CostPerRun > 0, cost(b.CostPerRun))),
			raised("requests_per_minute", orDash(b.RequestsPerMinute > 0, fmt.Sprint(b.RequestsPerMinute))),
			b.Calls, b.Refused)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, b := range list {
		if len(b.Raised) > 0 {
			fmt.Fprintf(w, "* %s of %s changed live with berthctl budget set; \"default\" goes back to berth.toml's\n", strings.Join(b.Raised, ", "), b.Agent)
		}
	}
	return nil
}

func orDash(set bool, s string) string {
	if !set {
		return "-"
	}
	return s
}
