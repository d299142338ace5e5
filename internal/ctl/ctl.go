// Package ctl is berthctl: a D-Bus client of the berth services plus offline
// config checks. It holds no state and opens no database.
package ctl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/config"
)

const usage = `usage: berthctl COMMAND [ARGS]

Commands:
  config check [--config FILE] [--agent ID]   validate the config; with --agent print its effective settings
  status                                      are the services up, queue depth, running runs
  runs list [--state S] [--agent A] [--schedule ID] [--limit N] [--before RUN_ID | --all] [--json]
                                              newest first, N per page (default 50, at most 500)
  runs show RUN_ID [--json]
  runs cancel RUN_ID
  send [--timeout D] AGENT TEXT               submit TEXT to AGENT and wait for the reply
  providers test [NAME]                       a probe run of an agent calls each provider (or NAME) once through its egress proxy, as runs do: reachability, auth, model, latency
  sandbox explain [--json] AGENT              the plan the scheduler would use for AGENT: backend, image, limits, network, mounts, user, and why
  sandboxes [--agent A] [--json] | stop ID    the live conversation sandboxes: conversation, backend, last activity, idle for, runs, memory; stop one
  schedules [--json] | run ID                  the [[schedules]] jobs: next run, last run and its state; fire one now
  egress explain [--method M] [--json] AGENT URL|HOST:PORT
                                              would AGENT's egress proxy let the request pass, by which rule or why not (exit 0 pass, 1 refused, 2 bad question)
  egress explain --git fetch|push [--json] AGENT REMOTE [REF]
                                              the same for a git fetch of REMOTE, or a push of REF to it, by AGENT's [[agents.egress.git]] rules
  usage [--agent A] [--since 7d] [--json]     what each agent spent on providers per day (UTC): calls, tokens, cost, refusals
  budget [show] [--json] [AGENT] | set AGENT KEY VALUE|default
                                              [agents.budget] with today's spending; set changes a key live (live runs get it at once)
  approvals [list] [--state S] [--json] | allow [--standing | --conversation] ID | deny ID
                                              requests held by an [agents.egress] ask rule; allow or deny one (admins)
  container build [--agent ID] [--no-cache]   build an agent's images (default: [image_config]) and follow the build
  container status | images [--json] | clean [--all] | dockerfile [--agent ID] | rm TAG

The bus is the system bus, or DBUS_SYSTEM_BUS_ADDRESS when set.
`

// Exit codes.
const (
	ExitOK      = 0
	ExitFailed  = 1 // the command ran and the answer is "no" (bad config, failed run)
	ExitUsage   = 2
	ExitUnavail = 3 // a service could not be reached
)

// Main runs berthctl with args (without the program name).
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return ExitUsage
		}
		return ExitOK
	}
	c := &cli{out: stdout, errOut: stderr}
	var err error
	switch args[0] {
	case "config":
		err = c.config(args[1:])
	case "status":
		err = c.status(args[1:])
	case "runs":
		err = c.runs(args[1:])
	case "send":
		err = c.send(args[1:])
	case "providers":
		err = c.providers(args[1:])
	case "sandbox":
		err = c.sandbox(args[1:])
	case "sandboxes":
		err = c.sandboxes(args[1:])
	case "schedules":
		err = c.schedules(args[1:])
	case "egress":
		err = c.egress(args[1:])
	case "container":
		err = c.container(args[1:])
	case "usage":
		err = c.usage(args[1:])
	case "budget":
		err = c.budget(args[1:])
	case "approvals":
		err = c.approvals(args[1:])
	default:
		err = usageError("unknown command %q", args[0])
	}
	if err == nil {
		return ExitOK
	}
	fmt.Fprintf(stderr, "berthctl: %v\n", err)
	var ue *usageErr
	var ee *exitErr
	switch {
	case errors.As(err, &ue):
		fmt.Fprint(stderr, usage)
		return ExitUsage
	case errors.As(err, &ee):
		return ee.code
	case bus.ErrorName(err) == "org.freedesktop.DBus.Error.ServiceUnknown" || bus.ErrorName(err) == "org.freedesktop.DBus.Error.NoReply":
		return ExitUnavail
	}
	return ExitFailed
}

type usageErr struct{ msg string }

func (e *usageErr) Error() string { return e.msg }

func usageError(format string, args ...any) error {
	return &usageErr{fmt.Sprintf(format, args...)}
}

type exitErr struct {
	code int
	msg  string
}

func (e *exitErr) Error() string { return e.msg }

type cli struct {
	out, errOut io.Writer
	conn        *dbus.Conn
}

func (c *cli) connect() (*dbus.Conn, error) {
	if c.conn != nil {
		return c.conn, nil
	}
	conn, err := bus.ConnectSystem()
	if err != nil {
		return nil, &exitErr{ExitUnavail, err.Error()}
	}
	c.conn = conn
	return conn, nil
}

func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func (c *cli) config(args []string) error {
	if len(args) == 0 || args[0] != "check" {
		return usageError("usage: berthctl config check [--config FILE] [--agent ID]")
	}
	fs := newFlags("config check")
	path := fs.String("config", "", "config file")
	agent := fs.String("agent", "", "print this agent's effective settings")
	if err := fs.Parse(args[1:]); err != nil {
		return usageError("%v", err)
	}
	p := *path
	if p == "" {
		p = os.Getenv("BERTH_CONFIG")
	}
	if p == "" {
		p = config.DefaultPath
	}
	if err := config.WriteCheck(c.out, p, *agent); err != nil {
		return &exitErr{ExitFailed, fmt.Sprintf("config %s is not valid", p)}
	}
	return nil
}

func (c *cli) status(args []string) error {
	if len(args) != 0 {
		return usageError("status takes no arguments")
	}
	conn, err := c.connect()
	if err != nil {
		return err
	}
	ctx := context.Background()
	activatable, _ := busapi.Activatable(ctx, conn) // without it, no service "starts on demand"
	down := 0
	for _, svc := range []struct {
		label, name string
		// show reads the service's properties (never starting it) and
		// returns its line; after runs once the line is written.
		show func() (line string, after func() error, err error)
	}{
		{"scheduler", bus.SchedulerName, func() (string, func() error, error) {
			st, err := busapi.NewScheduler(conn).Properties(ctx)
			after := func() error {
				if st.Quarantined > 0 {
					fmt.Fprintf(c.out, "%-10s %d undecodable record(s) quarantined: kept aside in bucket quarantine of the service's database; the journal says which\n", "", st.Quarantined)
				}
				return nil
			}
			return fmt.Sprintf("QueueDepth=%d Running=%d Quarantined=%d", st.QueueDepth, st.Running, st.Quarantined), after, err
		}},
		{"intake", bus.IntakeName, func() (string, func() error, error) {
			st, err := busapi.NewIntake(conn).Properties(ctx)
			return fmt.Sprintf("InboxPending=%d OutboxPending=%d", st.InboxPending, st.OutboxPending), func() error { return writeConnectors(c.out, st.Connectors) }, err
		}},
		{"images", bus.ImagesName, func() (string, func() error, error) {
			st, err := busapi.NewImages(conn).Properties(ctx)
			return fmt.Sprintf("Building=%d ImageCount=%d", st.Building, st.ImageCount), nil, err
		}},
	} {
		line, after, err := svc.show()
		if err != nil && bus.ErrorName(err) == "" {
			return fmt.Errorf("cannot read %s properties: %w", svc.label, err)
		}
		if err != nil {
			state := "not running"
			if slices.Contains(activatable, svc.name) {
				state = "not running (starts on demand)"
			}
			if bus.ErrorName(err) != "org.freedesktop.DBus.Error.ServiceUnknown" && bus.ErrorName(err) != "org.freedesktop.DBus.Error.NameHasNoOwner" {
				state = "unreachable: " + err.Error()
				down++
			}
			fmt.Fprintf(c.out, "%-10s %s\n", svc.label+":", state)
			continue
		}
		fmt.Fprintf(c.out, "%-10s running  %s\n", svc.label+":", line)
		if after != nil {
			if err := after(); err != nil {
				return err
			}
		}
	}
	if down > 0 {
		return &exitErr{ExitUnavail, "some services are unreachable"}
	}
	return nil
}

func (c *cli) scheduler() (busapi.Scheduler, error) {
	conn, err := c.connect()
	if err != nil {
		return busapi.Scheduler{}, err
	}
	return busapi.NewScheduler(conn), nil
}

func (c *cli) runs(args []string) error {
	if len(args) == 0 {
		return usageError("usage: berthctl runs list|show|cancel")
	}
	switch args[0] {
	case "list":
		fs := newFlags("runs list")
		state := fs.String("state", "", "only runs in this state")
		agent := fs.String("agent", "", "only runs of this agent")
		schedule := fs.String("schedule", "", "only runs this [[schedules]] job fired")
		limit := fs.Uint("limit", 50, "at most this many runs per page (at most 500)")
		before := fs.String("before", "", "only runs older than this run id (the next page)")
		all := fs.Bool("all", false, "walk every page")
		asJSON := fs.Bool("json", false, "print JSON")
		if err := fs.Parse(args[1:]); err != nil {
			return usageError("%v", err)
		}
		if fs.NArg() != 0 {
			return usageError("runs list takes no arguments")
		}
		if *limit == 0 || *limit > 500 {
			return usageError("--limit must be between 1 and 500")
		}
		if *all && *before != "" {
			return usageError("--all and --before do not go together")
		}
		sched, err := c.scheduler()
		if err != nil {
			return err
		}
		var runs []busapi.RunSummary
		cursor := *before
		for {
			page, err := sched.ListRuns(context.Background(), busapi.ListFilter{State: *state, Agent: *agent, Schedule: *schedule, Limit: uint32(*limit), Before: cursor})
			if err != nil {
				return fmt.Errorf("cannot list runs: %w", err)
			}
			runs = append(runs, page...)
			if len(page) < int(*limit) {
				cursor = ""
				break
			}
			cursor = page[len(page)-1].ID
			if !*all {
				break
			}
		}
		if cursor != "" {
			fmt.Fprintf(c.errOut, "more runs: berthctl runs list --before %s (or --all)\n", cursor)
		}
		if *asJSON {
			plain := make([]map[string]any, 0, len(runs))
			for _, r := range runs {
				plain = append(plain, r.Plain())
			}
			return writeJSON(c.out, plain)
		}
		return writeRunList(c.out, runs)
	case "show":
		fs := newFlags("runs show")
		asJSON := fs.Bool("json", false, "print JSON")
		if err := fs.Parse(args[1:]); err != nil {
			return usageError("%v", err)
		}
		if fs.NArg() != 1 {
			return usageError("usage: berthctl runs show RUN_ID")
		}
		sched, err := c.scheduler()
		if err != nil {
			return err
		}
		run, err := sched.GetRun(context.Background(), fs.Arg(0))
		if err != nil {
			return fmt.Errorf("cannot get run %s: %w", fs.Arg(0), err)
		}
		if err := run.ReadCut(context.Background(), sched); err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(c.out, run.Plain())
		}
		printRun(c.out, run)
		return nil
	case "cancel":
		if len(args) != 2 {
			return usageError("usage: berthctl runs cancel RUN_ID")
		}
		sched, err := c.scheduler()
		if err != nil {
			return err
		}
		if err := sched.CancelRun(context.Background(), args[1]); err != nil {
			return fmt.Errorf("cannot cancel run %s: %w", args[1], err)
		}
		fmt.Fprintf(c.out, "run %s canceled\n", args[1])
		return nil
	}
	return usageError("unknown runs command %q", args[0])
}

func (c *cli) send(args []string) error {
	fs := newFlags("send")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long to wait for the reply")
	if err := fs.Parse(args); err != nil {
		return usageError("%v", err)
	}
	if fs.NArg() != 2 {
		return usageError("usage: berthctl send [--timeout D] AGENT TEXT")
	}
	agentID, text := fs.Arg(0), fs.Arg(1)
	sched, err := c.scheduler()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	// Subscribe before submitting so the RunFinished signal cannot be missed.
	finished, err := sched.RunFinished(ctx)
	if err != nil {
		return err
	}

	author := "berthctl"
	if u, err := user.Current(); err == nil {
		author = u.Username
	}
	msg := busapi.Submission{MessageID: "berthctl/" + randomID(), Agent: agentID, Author: author, Text: text, Channel: "berthctl"}
	runID, err := sched.Submit(ctx, msg)
	if err != nil {
		return fmt.Errorf("cannot submit: %w", err)
	}
	fmt.Fprintf(c.errOut, "run %s queued for agent %s\n", runID, agentID)

	poll := time.NewTicker(2 * time.Second) // in case a signal was lost
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return &exitErr{ExitFailed, fmt.Sprintf("run %s did not finish within %s (it goes on; see berthctl runs show %s)", runID, *timeout, runID)}
		case ended := <-finished:
			if ended.RunID != runID {
				continue
			}
		case <-poll.C:
		}
		run, err := sched.GetRun(ctx, runID)
		if err != nil {
			return fmt.Errorf("cannot get run %s: %w", runID, err)
		}
		switch run.State {
		case busapi.StateSucceeded:
			fmt.Fprintln(c.out, run.Reply.Text)
			return nil
		case busapi.StateFailed, busapi.StateCanceled:
			if r := run.Reply.Text; r != "" {
				fmt.Fprintln(c.out, r)
			}
			return &exitErr{ExitFailed, fmt.Sprintf("run %s %s: %s %s", runID, run.State, run.Reason, run.Error.Text)}
		}
	}
}

// writeRunList prints runs as `runs list` does: one line each.
func writeRunList(w io.Writer, runs []busapi.RunSummary) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tAGENT\tSTATE\tCREATED\tSCHEDULE\tREASON\tTEXT")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Agent, r.State, localTime(r.CreatedAt), r.Schedule, r.Reason, previewCell(r.TextPreview, 40))
	}
	return tw.Flush()
}

// previewCell is s on one line, at most n characters.
func previewCell(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func randomID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// localTime is t as berthctl prints times: local, to the second; "" for
// the zero time.
func localTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// maxRuntime is a scheduled run's max_runtime as berth.toml writes it; ""
// for the agent's timeout.
func maxRuntime(seconds int64) string {
	if seconds == 0 {
		return ""
	}
	return (time.Duration(seconds) * time.Second).String()
}

func printRun(w io.Writer, run busapi.Run) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, f := range []struct{ key, val string }{
		{"id", run.ID}, {"agent", run.Agent}, {"state", run.State}, {"reason", run.Reason}, {"error", run.Error.Text},
		{"backend", run.Backend}, {"message_id", run.MessageID}, {"connector", run.Connector}, {"channel", run.Channel},
		{"thread", run.Thread}, {"author", run.Author}, {"attempts", fmt.Sprint(run.Attempts)},
		{"created", localTime(run.CreatedAt)}, {"started", localTime(run.StartedAt)}, {"finished", localTime(run.FinishedAt)},
		{"delivered", fmt.Sprint(run.Delivered)}, {"sandbox", run.Sandbox}, {"sandbox_note", run.SandboxNote},
		{"schedule", run.Schedule}, {"model", run.Model}, {"max_runtime", maxRuntime(run.MaxRuntimeSeconds)},
		{"trace", run.TraceID},
	} {
		if f.val != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", f.key, f.val)
		}
	}
	tw.Flush()
	if t := run.Text.Text; t != "" {
		fmt.Fprintf(w, "\nmessage:\n%s\n", indent(t))
	}
	if calls, err := run.Calls(); err == nil && len(calls) > 0 {
		fmt.Fprintln(w, "\ntool calls:")
		for _, c := range calls {
			line := "  " + c.Name + " " + string(c.Args)
			if c.Error != "" {
				line += "  (error: " + c.Error + ")"
			}
			fmt.Fprintln(w, line)
		}
	}
	writeMCP(w, run)
	writeEgress(w, run)
	writeUsage(w, run)
	if r := run.Reply.Text; r != "" {
		fmt.Fprintf(w, "\nreply:\n%s\n", indent(r))
	}
}

// writeMCP prints each MCP server of the run: its transport and the tools
// the model was offered, or why it gave none.
func writeMCP(w io.Writer, run busapi.Run) {
	servers, err := run.MCPServers()
	if err != nil || len(servers) == 0 {
		return
	}
	writeMCPServers(w, "mcp servers:", servers)
}

// writeMCPServers prints servers under title, one line each.
func writeMCPServers(w io.Writer, title string, servers []busapi.MCPStatus) {
	fmt.Fprintln(w, "\n"+title)
	for _, s := range servers {
		line := fmt.Sprintf("  %s (%s): ", s.Name, s.Transport)
		switch {
		case s.Error != "":
			line += "FAILED " + s.Error
			if len(s.Tools) > 0 {
				line += " (its tools answer with this error: " + strings.Join(s.Tools, ", ") + ")"
			}
		case len(s.Tools) == 0:
			line += "no tools"
		default:
			line += strings.Join(s.Tools, ", ")
		}
		fmt.Fprintln(w, line)
	}
}

// writeEgress prints the egress proxy's decisions, one line each:
// time, method, host:port, path, allowed or REFUSED, rule or reason, bytes.
func writeEgress(w io.Writer, run busapi.Run) {
	decisions, err := run.EgressDecisions()
	if err != nil || len(decisions) == 0 {
		return
	}
	fmt.Fprintln(w, "\negress:")
	for _, d := range decisions {
		verdict, why := "allowed", d.Rule
		if !d.Allowed {
			verdict, why = "REFUSED", d.Reason
		}
		fmt.Fprintf(w, "  %s %s %s:%d %s %s %s ↑%d ↓%d\n", d.Time.Format("15:04:05"), d.Method, d.Host, d.Port, d.Path, verdict, why, d.BytesUp, d.BytesDown)
	}
	if n := run.EgressDropped; n > 0 {
		fmt.Fprintf(w, "  (%d more not kept)\n", n)
	}
	writeEgressCounts(w, run)
}

// writeEgressCounts prints every decision of the run counted by host: the
// record keeps only some decisions, the counts hold them all.
func writeEgressCounts(w io.Writer, run busapi.Run) {
	counts, err := run.EgressTally()
	if err != nil || counts.Allowed+counts.Refused == 0 {
		return
	}
	fmt.Fprintf(w, "egress counts: %d allowed, %d refused\n", counts.Allowed, counts.Refused)
	for _, h := range counts.Hosts {
		fmt.Fprintf(w, "  %s %d allowed %d refused\n", h.Host, h.Allowed, h.Refused)
	}
	if o := counts.OtherHosts; o.Allowed+o.Refused > 0 {
		fmt.Fprintf(w, "  (other hosts) %d allowed %d refused\n", o.Allowed, o.Refused)
	}
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ")
}
