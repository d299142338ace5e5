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
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/config"
	"github.com/berth-dev/berth/isolation"
)

const usage = `usage: berthctl COMMAND [ARGS]

Commands:
  config check [--config FILE] [--agent ID]   validate the config; with --agent print its effective settings
  status                                      are the services up, queue depth, running runs
  runs list [--state S] [--agent A] [--limit N] [--before RUN_ID | --all] [--json]
                                              newest first, N per page (default 50, at most 500)
  runs show RUN_ID [--json]
  runs cancel RUN_ID
  send [--timeout D] AGENT TEXT               submit TEXT to AGENT and wait for the reply
  providers test [NAME]                       the scheduler calls each provider (or NAME) once with its own environment: reachability, auth, model, latency
  sandbox explain [--json] AGENT              the plan the scheduler would use for AGENT: backend, image, limits, network, mounts, user, and why
  egress explain [--method M] [--json] AGENT URL|HOST:PORT
                                              would AGENT's egress proxy let the request pass, by which rule or why not (exit 0 pass, 1 refused, 2 bad question)
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
	case "egress":
		err = c.egress(args[1:])
	case "container":
		err = c.container(args[1:])
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
	var activatable []string
	_ = conn.BusObject().Call("org.freedesktop.DBus.ListActivatableNames", 0).Store(&activatable)
	down := 0
	for _, svc := range []struct {
		label, name string
		path        dbus.ObjectPath
		props       []string
	}{
		{"scheduler", bus.SchedulerName, bus.SchedulerPath, []string{"QueueDepth", "Running", "Quarantined"}},
		{"intake", bus.IntakeName, bus.IntakePath, []string{"InboxPending", "OutboxPending"}},
		{"images", bus.ImagesName, bus.ImagesPath, []string{"Building", "ImageCount"}},
	} {
		// NoAutoStart: asking for status must not start a service.
		call := conn.Object(svc.name, svc.path).Call("org.freedesktop.DBus.Properties.GetAll", dbus.FlagNoAutoStart, svc.name)
		if call.Err != nil {
			state := "not running"
			for _, a := range activatable {
				if a == svc.name {
					state = "not running (starts on demand)"
				}
			}
			if bus.ErrorName(call.Err) != "org.freedesktop.DBus.Error.ServiceUnknown" && bus.ErrorName(call.Err) != "org.freedesktop.DBus.Error.NameHasNoOwner" {
				state = "unreachable: " + call.Err.Error()
				down++
			}
			fmt.Fprintf(c.out, "%-10s %s\n", svc.label+":", state)
			continue
		}
		var props map[string]dbus.Variant
		if err := call.Store(&props); err != nil {
			return fmt.Errorf("cannot read %s properties: %w", svc.label, err)
		}
		var parts []string
		for _, p := range svc.props {
			if v, ok := props[p]; ok {
				parts = append(parts, fmt.Sprintf("%s=%v", p, v.Value()))
			}
		}
		fmt.Fprintf(c.out, "%-10s running  %s\n", svc.label+":", strings.Join(parts, " "))
		if v, ok := props["Connectors"]; ok && svc.name == bus.IntakeName {
			if err := writeConnectors(c.out, v); err != nil {
				return err
			}
		}
		if n, ok := props["Quarantined"].Value().(uint32); ok && n > 0 {
			fmt.Fprintf(c.out, "%-10s %d undecodable record(s) quarantined: kept aside in bucket quarantine of the service's database; the journal says which\n", "", n)
		}
	}
	if down > 0 {
		return &exitErr{ExitUnavail, "some services are unreachable"}
	}
	return nil
}

func (c *cli) scheduler() (dbus.BusObject, error) {
	conn, err := c.connect()
	if err != nil {
		return nil, err
	}
	return conn.Object(bus.SchedulerName, bus.SchedulerPath), nil
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
		obj, err := c.scheduler()
		if err != nil {
			return err
		}
		var runs []map[string]dbus.Variant
		cursor := *before
		for {
			filter := map[string]dbus.Variant{"limit": dbus.MakeVariant(uint32(*limit))}
			if *state != "" {
				filter["state"] = dbus.MakeVariant(*state)
			}
			if *agent != "" {
				filter["agent"] = dbus.MakeVariant(*agent)
			}
			if cursor != "" {
				filter["before"] = dbus.MakeVariant(cursor)
			}
			var page []map[string]dbus.Variant
			if err := obj.Call(bus.SchedulerInterface+".ListRuns", 0, filter).Store(&page); err != nil {
				return fmt.Errorf("cannot list runs: %w", err)
			}
			runs = append(runs, page...)
			if len(page) < int(*limit) {
				cursor = ""
				break
			}
			cursor = str(page[len(page)-1], "id")
			if !*all {
				break
			}
		}
		if cursor != "" {
			fmt.Fprintf(c.errOut, "more runs: berthctl runs list --before %s (or --all)\n", cursor)
		}
		if *asJSON {
			return writeJSON(c.out, plainRuns(runs))
		}
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "RUN\tAGENT\tSTATE\tCREATED\tREASON\tTEXT")
		for _, r := range runs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", str(r, "id"), str(r, "agent"), str(r, "state"), usecTime(r, "created_usec"), str(r, "reason"), previewCell(str(r, "text_preview"), 40))
		}
		return tw.Flush()
	case "show":
		fs := newFlags("runs show")
		asJSON := fs.Bool("json", false, "print JSON")
		if err := fs.Parse(args[1:]); err != nil {
			return usageError("%v", err)
		}
		if fs.NArg() != 1 {
			return usageError("usage: berthctl runs show RUN_ID")
		}
		obj, err := c.scheduler()
		if err != nil {
			return err
		}
		var run map[string]dbus.Variant
		if err := obj.Call(bus.SchedulerInterface+".GetRun", 0, fs.Arg(0)).Store(&run); err != nil {
			return fmt.Errorf("cannot get run %s: %w", fs.Arg(0), err)
		}
		if err := readCutTexts(obj, fs.Arg(0), run); err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(c.out, plainRun(run))
		}
		printRun(c.out, run)
		return nil
	case "cancel":
		if len(args) != 2 {
			return usageError("usage: berthctl runs cancel RUN_ID")
		}
		obj, err := c.scheduler()
		if err != nil {
			return err
		}
		if err := obj.Call(bus.SchedulerInterface+".CancelRun", 0, args[1]).Err; err != nil {
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
	conn, err := c.connect()
	if err != nil {
		return err
	}
	// Subscribe before submitting so the RunFinished signal cannot be missed.
	if err := conn.AddMatchSignal(dbus.WithMatchInterface(bus.SchedulerInterface), dbus.WithMatchMember("RunFinished")); err != nil {
		return fmt.Errorf("cannot subscribe to RunFinished: %w", err)
	}
	signals := make(chan *dbus.Signal, 64)
	conn.Signal(signals)

	author := "berthctl"
	if u, err := user.Current(); err == nil {
		author = u.Username
	}
	msg := map[string]string{"id": "berthctl/" + randomID(), "agent": agentID, "author": author, "text": text, "channel": "berthctl"}
	var runID string
	obj := conn.Object(bus.SchedulerName, bus.SchedulerPath)
	if err := obj.Call(bus.SchedulerInterface+".Submit", 0, msg).Store(&runID); err != nil {
		return fmt.Errorf("cannot submit: %w", err)
	}
	fmt.Fprintf(c.errOut, "run %s queued for agent %s\n", runID, agentID)

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	poll := time.NewTicker(2 * time.Second) // in case a signal was lost
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return &exitErr{ExitFailed, fmt.Sprintf("run %s did not finish within %s (it goes on; see berthctl runs show %s)", runID, *timeout, runID)}
		case s := <-signals:
			if s == nil || len(s.Body) < 4 || s.Body[0] != runID {
				continue
			}
		case <-poll.C:
		}
		var run map[string]dbus.Variant
		if err := obj.Call(bus.SchedulerInterface+".GetRun", 0, runID).Store(&run); err != nil {
			return fmt.Errorf("cannot get run %s: %w", runID, err)
		}
		switch str(run, "state") {
		case "succeeded":
			fmt.Fprintln(c.out, str(run, "reply"))
			return nil
		case "failed", "canceled":
			if r := str(run, "reply"); r != "" {
				fmt.Fprintln(c.out, r)
			}
			return &exitErr{ExitFailed, fmt.Sprintf("run %s %s: %s %s", runID, str(run, "state"), str(run, "reason"), str(run, "error"))}
		}
	}
}

// outputNames maps GetRun's long texts to GetRunOutput's names for them.
var outputNames = map[string]string{"text": "text", "reply": "reply", "error": "error", "tool_calls": "tool_calls", "stderr_tail": "stderr"}

// readCutTexts replaces each text GetRun cut (<key>_cut) with the whole of
// it, read page by page with GetRunOutput.
func readCutTexts(obj dbus.BusObject, id string, run map[string]dbus.Variant) error {
	for key, what := range outputNames {
		if cut, _ := run[key+"_cut"].Value().(bool); !cut {
			continue
		}
		var whole strings.Builder
		for offset := uint64(0); ; {
			var chunk string
			var next uint64
			if err := obj.Call(bus.SchedulerInterface+".GetRunOutput", 0, id, what, offset).Store(&chunk, &next); err != nil {
				return fmt.Errorf("cannot read %s of run %s: %w", what, id, err)
			}
			whole.WriteString(chunk)
			if next == 0 || next <= offset {
				break
			}
			offset = next
		}
		run[key] = dbus.MakeVariant(whole.String())
		run[key+"_cut"] = dbus.MakeVariant(false)
	}
	return nil
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

func str(m map[string]dbus.Variant, key string) string {
	if v, ok := m[key]; ok {
		if s, ok := v.Value().(string); ok {
			return s
		}
		return fmt.Sprint(v.Value())
	}
	return ""
}

func usecTime(m map[string]dbus.Variant, key string) string {
	v, ok := m[key]
	if !ok {
		return ""
	}
	u, ok := v.Value().(uint64)
	if !ok || u == 0 {
		return ""
	}
	return time.UnixMicro(int64(u)).Local().Format("2006-01-02 15:04:05")
}

func plainRun(m map[string]dbus.Variant) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v.Value()
	}
	return out
}

func plainRuns(runs []map[string]dbus.Variant) []map[string]any {
	out := make([]map[string]any, 0, len(runs))
	for _, r := range runs {
		out = append(out, plainRun(r))
	}
	return out
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printRun(w io.Writer, run map[string]dbus.Variant) {
	order := []string{"id", "agent", "state", "reason", "error", "backend", "message_id", "connector", "channel", "thread", "author", "attempts", "created_usec", "started_usec", "finished_usec", "delivered", "text", "reply"}
	seen := map[string]bool{}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, k := range order {
		seen[k] = true
		if _, ok := run[k]; !ok {
			continue
		}
		val := str(run, k)
		if strings.HasSuffix(k, "_usec") {
			val = usecTime(run, k)
		}
		if val == "" || k == "text" || k == "reply" {
			continue
		}
		fmt.Fprintf(tw, "%s:\t%s\n", strings.TrimSuffix(k, "_usec"), val)
	}
	var rest []string
	for k := range run {
		if !seen[k] && k != "stderr_tail" && k != "tool_calls" && k != "egress" && k != "egress_dropped" && !strings.HasSuffix(k, "_bytes") && !strings.HasSuffix(k, "_cut") {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	for _, k := range rest {
		if v := str(run, k); v != "" && v != "[]" {
			fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	tw.Flush()
	if t := str(run, "text"); t != "" {
		fmt.Fprintf(w, "\nmessage:\n%s\n", indent(t))
	}
	var calls []struct {
		Name  string          `json:"name"`
		Args  json.RawMessage `json:"args"`
		Error string          `json:"error"`
	}
	if json.Unmarshal([]byte(str(run, "tool_calls")), &calls) == nil && len(calls) > 0 {
		fmt.Fprintln(w, "\ntool calls:")
		for _, c := range calls {
			line := "  " + c.Name + " " + string(c.Args)
			if c.Error != "" {
				line += "  (error: " + c.Error + ")"
			}
			fmt.Fprintln(w, line)
		}
	}
	writeEgress(w, run)
	if r := str(run, "reply"); r != "" {
		fmt.Fprintf(w, "\nreply:\n%s\n", indent(r))
	}
}

// writeEgress prints the egress proxy's decisions, one line each:
// time, method, host:port, path, allowed or REFUSED, rule or reason, bytes.
func writeEgress(w io.Writer, run map[string]dbus.Variant) {
	var decisions []isolation.EgressDecision
	if json.Unmarshal([]byte(str(run, "egress")), &decisions) != nil || len(decisions) == 0 {
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
	if n, ok := run["egress_dropped"].Value().(uint32); ok && n > 0 {
		fmt.Fprintf(w, "  (%d more not kept)\n", n)
	}
	writeEgressCounts(w, run)
}

// writeEgressCounts prints every decision of the run counted by host: the
// record keeps only some decisions, the counts hold them all.
func writeEgressCounts(w io.Writer, run map[string]dbus.Variant) {
	var counts isolation.EgressCounts
	if json.Unmarshal([]byte(str(run, "egress_counts")), &counts) != nil || counts.Allowed+counts.Refused == 0 {
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
