package ctl

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/berth-dev/berth/internal/busapi"
)

// approvals is `berthctl approvals [list] [--state S] [--json]` and
// `berthctl approvals allow [--standing | --conversation] ID | deny ID`: the requests runs'
// egress proxies hold for a person to decide (issue 26).
func (c *cli) approvals(args []string) error {
	verb := "list"
	if len(args) > 0 && (args[0] == "list" || args[0] == "allow" || args[0] == "deny") {
		verb, args = args[0], args[1:]
	}
	fs := newFlags("approvals " + verb)
	state := fs.String("state", "", "only approvals in this state (pending, allowed, denied, expired, ended)")
	asJSON := fs.Bool("json", false, "print JSON")
	standing := fs.Bool("standing", false, "allow every later request the same rule matches, for the rest of the run's sandbox")
	conversation := fs.Bool("conversation", false, "allow every later request the same rule matches in this conversation, this run and later ones")
	if err := fs.Parse(args); err != nil {
		return usageError("%v", err)
	}
	sched, err := c.scheduler()
	if err != nil {
		return err
	}
	ctx := context.Background()
	if verb == "list" {
		if fs.NArg() != 0 {
			return usageError("usage: berthctl approvals [list] [--state S] [--json]")
		}
		list, err := sched.ListApprovals(ctx, *state)
		if err != nil {
			return fmt.Errorf("cannot list approvals: %w", err)
		}
		if *asJSON {
			if list == nil {
				list = []busapi.Approval{}
			}
			return writeJSON(c.out, list)
		}
		return writeApprovalList(c.out, list)
	}
	if fs.NArg() != 1 || (verb == "deny" && (*standing || *conversation)) || (*standing && *conversation) {
		return usageError("usage: berthctl approvals allow [--standing | --conversation] ID | approvals deny ID")
	}
	decision := busapi.DecisionDeny
	if verb == "allow" {
		decision = busapi.DecisionAllowOnce
		if *standing {
			decision = busapi.DecisionAllowStanding
		}
		if *conversation {
			decision = busapi.DecisionAllowConversation
		}
	}
	ap, err := sched.DecideApproval(ctx, fs.Arg(0), decision)
	if err != nil {
		return fmt.Errorf("cannot decide approval %s: %w", fs.Arg(0), err)
	}
	fmt.Fprintf(c.out, "approval %s %s: %s (run %s of agent %s)\n", ap.ID, ap.State, ap.What, ap.RunID, ap.Agent)
	return nil
}

func writeApprovalList(w io.Writer, list []busapi.Approval) error {
	if len(list) == 0 {
		_, err := fmt.Fprintln(w, "no approvals: a run asks when an [agents.egress] ask rule matches its request")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tAGENT\tWHAT\tRULE\tSTATE\tBY\tASKED\tDEADLINE")
	for _, a := range list {
		by := a.By
		if by == "" {
			by = "-"
		}
		state := a.State
		switch {
		case a.Conversation:
			state += " (conversation)"
		case a.Standing:
			state += " (standing)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Agent, a.What, a.Rule, state, by, localTime(a.AskedAt), localTime(a.Deadline))
	}
	return tw.Flush()
}
