package ctl

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"
)

const providersUsage = "usage: berthctl providers test [NAME]"

// providers runs "providers test": the running scheduler makes one small
// call to each configured provider (or the named one) with its own
// environment and keys (dev.berth.Scheduler1.TestProviders), so a pass here
// means real runs reach the model. It exits 1 when any fails.
func (c *cli) providers(args []string) error {
	if len(args) == 0 || args[0] != "test" {
		return usageError(providersUsage)
	}
	fs := newFlags("providers test")
	if err := fs.Parse(args[1:]); err != nil || fs.NArg() > 1 {
		return usageError(providersUsage)
	}
	sched, err := c.scheduler()
	if err != nil {
		return err
	}
	// Each check may take its provider's whole timeout; they run side by side.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	results, err := sched.TestProviders(ctx, fs.Arg(0))
	if err != nil {
		return fmt.Errorf("cannot ask the scheduler to test providers: %w", err)
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tKIND\tMODEL\tRESULT\tLATENCY\tDETAIL")
	failed := 0
	for _, r := range results {
		if r.Status != "ok" {
			failed++
		}
		latency := "-"
		if ms := r.LatencyMS; ms > 0 || r.Status == "ok" && r.Kind != "local" {
			latency = fmt.Sprintf("%dms", ms)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, r.Kind, r.Model, r.Status, latency, r.Detail)
	}
	tw.Flush()
	if failed > 0 {
		return &exitErr{ExitFailed, fmt.Sprintf("%d of %d providers failed (tested by the scheduler, with its environment)", failed, len(results))}
	}
	return nil
}
