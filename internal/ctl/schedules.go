package ctl

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/berth-dev/berth/internal/busapi"
)

// schedules is `berthctl schedules [--json]` and `berthctl schedules run
// ID`: the [[schedules]] jobs, and one fired now (issue 25).
func (c *cli) schedules(args []string) error {
	if len(args) > 0 && args[0] == "run" {
		if len(args) != 2 {
			return usageError("usage: berthctl schedules run ID")
		}
		sched, err := c.scheduler()
		if err != nil {
			return err
		}
		outcome, err := sched.RunSchedule(context.Background(), args[1])
		if err != nil {
			return fmt.Errorf("cannot run schedule %s: %w", args[1], err)
		}
		switch outcome {
		case "queued":
			fmt.Fprintf(c.out, "schedule %s queued: it runs when its running firing ends\n", args[1])
		case "skipped":
			return &exitErr{ExitFailed, fmt.Sprintf("schedule %s skipped: its previous firing is still running", args[1])}
		default:
			fmt.Fprintf(c.out, "schedule %s %s: berthctl schedules shows how it goes\n", args[1], outcome)
		}
		return nil
	}
	fs := newFlags("schedules")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return usageError("%v", err)
	}
	if fs.NArg() != 0 {
		return usageError("usage: berthctl schedules [--json] | schedules run ID")
	}
	sched, err := c.scheduler()
	if err != nil {
		return err
	}
	list, err := sched.ListSchedules(context.Background())
	if err != nil {
		return fmt.Errorf("cannot list schedules: %w", err)
	}
	if *asJSON {
		if list == nil {
			list = []busapi.Schedule{}
		}
		return writeJSON(c.out, list)
	}
	return writeScheduleList(c.out, list)
}

func writeScheduleList(w io.Writer, list []busapi.Schedule) error {
	if len(list) == 0 {
		_, err := fmt.Fprintln(w, "no schedules: add [[schedules]] to berth.toml")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCHEDULE\tAGENT\tON CALENDAR\tDELIVER TO\tNEXT\tLAST RUN\tLAST STATE")
	for _, s := range list {
		to := s.Connector + "/" + s.Channel
		if s.Thread != "" {
			to += "/" + s.Thread
		}
		next := localTime(s.Next)
		if next == "" {
			next = "never"
		}
		state := s.LastState
		switch {
		case state == "":
			state = "never"
		case s.LastDetail != "":
			state += ": " + s.LastDetail
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Agent, s.OnCalendar, to, next, localTime(s.LastStart), state)
	}
	return tw.Flush()
}
