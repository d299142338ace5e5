package ctl

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
)

// sandboxes is `berthctl sandboxes [--agent A] [--json]` and `berthctl
// sandboxes stop ID`: the live conversation sandboxes (issue 22).
func (c *cli) sandboxes(args []string) error {
	if len(args) > 0 && args[0] == "stop" {
		if len(args) != 2 {
			return usageError("usage: berthctl sandboxes stop SANDBOX_ID")
		}
		sched, err := c.scheduler()
		if err != nil {
			return err
		}
		if err := sched.StopSandbox(context.Background(), args[1]); err != nil {
			return fmt.Errorf("cannot stop sandbox %s: %w", args[1], err)
		}
		fmt.Fprintf(c.out, "sandbox %s stopped\n", args[1])
		return nil
	}
	fs := newFlags("sandboxes")
	agent := fs.String("agent", "", "only sandboxes of this agent")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return usageError("%v", err)
	}
	if fs.NArg() != 0 {
		return usageError("usage: berthctl sandboxes [--agent A] [--json] | sandboxes stop SANDBOX_ID")
	}
	sched, err := c.scheduler()
	if err != nil {
		return err
	}
	list, err := sched.ListSandboxes(context.Background(), *agent)
	if err != nil {
		return fmt.Errorf("cannot list sandboxes: %w", err)
	}
	if *asJSON {
		return writeJSON(c.out, list)
	}
	return writeSandboxList(c.out, list)
}

func writeSandboxList(w io.Writer, list []busapi.Sandbox) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX\tAGENT\tCONNECTOR\tCHANNEL\tTHREAD\tBACKEND\tSTARTED\tLAST ACTIVITY\tIDLE FOR\tRUNS\tMEMORY")
	for _, sb := range list {
		idle := sb.IdleFor.Round(time.Second).String()
		if sb.Busy {
			idle = "busy"
		}
		mem := "unknown"
		if sb.MemoryBytes >= 0 {
			mem = fmt.Sprintf("%.1f MiB", float64(sb.MemoryBytes)/(1<<20))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.Agent, strconv.Quote(sb.Connector), strconv.Quote(sb.Channel), strconv.Quote(sb.Thread),
			sb.Backend, localTime(sb.Started), localTime(sb.LastActivity), idle, strconv.FormatUint(uint64(sb.Runs), 10), mem)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, sb := range list {
		if sb.MemoryBytes < 0 && sb.MemoryUnknown != "" {
			fmt.Fprintf(w, "memory of %s: %s\n", sb.ID, sb.MemoryUnknown)
		}
	}
	return nil
}
