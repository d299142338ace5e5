package ctl

import (
	"fmt"
	"text/tabwriter"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
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
	obj, err := c.scheduler()
	if err != nil {
		return err
	}
	var results []map[string]dbus.Variant
	if err := obj.Call(bus.SchedulerInterface+".TestProviders", 0, fs.Arg(0)).Store(&results); err != nil {
		return fmt.Errorf("cannot ask the scheduler to test providers: %w", err)
	}
	str := func(m map[string]dbus.Variant, key string) string {
		s, _ := m[key].Value().(string)
		return s
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tKIND\tMODEL\tRESULT\tLATENCY\tDETAIL")
	failed := 0
	for _, r := range results {
		status := str(r, "status")
		if status != "ok" {
			failed++
		}
		latency := "-"
		if ms, _ := r["latency_ms"].Value().(uint32); ms > 0 || status == "ok" && str(r, "kind") != "local" {
			latency = fmt.Sprintf("%dms", ms)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", str(r, "name"), str(r, "kind"), str(r, "model"), status, latency, str(r, "detail"))
	}
	tw.Flush()
	if failed > 0 {
		return &exitErr{ExitFailed, fmt.Sprintf("%d of %d providers failed (tested by the scheduler, with its environment)", failed, len(results))}
	}
	return nil
}
