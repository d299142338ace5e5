package busapi

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/godbus/dbus/v5"
)

// Run states, as the interface XML lists them.
const (
	StateQueued    = "queued"
	StateRunning   = "running"
	StateSucceeded = "succeeded"
	StateFailed    = "failed"
	StateCanceled  = "canceled"
)

// Output is one of a run's long texts as GetRun returns it: at most 1 MiB
// of it, its whole size, and whether it was cut (GetRunOutput reads the
// rest).
type Output struct {
	Text  string
	Bytes uint32
	Cut   bool
}

// RunHead is what Run and RunSummary both carry, so that the keys of the
// two records are named once and cannot drift apart.
type RunHead struct {
	ID         string
	MessageID  string // the scheduler's key of the message (MessageKey)
	Agent      string
	State      string
	Reason     string
	Connector  string
	Channel    string
	Thread     string
	Author     string
	Attempts   uint32
	Backend    string
	CreatedAt  time.Time
	StartedAt  time.Time
	FinishedAt time.Time
	Delivered  bool
	// Schedule is the [[schedules]] job that fired the run; "" for a
	// message's run.
	Schedule string
}

// Run is one run as dev.berth.Scheduler1.GetRun returns it.
type Run struct {
	RunHead

	Text       Output
	Reply      Output
	Error      Output
	ToolCalls  Output // a JSON array; "[]" when cut
	StderrTail Output
	// Egress is the JSON array of the egress decisions the record keeps,
	// EgressCounts the JSON object counting all of them.
	Egress        Output
	EgressCounts  Output
	EgressDropped uint32
	// MCP is the JSON array of how each of the agent's MCP servers fared
	// (MCPServers decodes it); "[]" without servers.
	MCP Output
	// Usage is the JSON object of what its provider calls spent
	// (RunUsage decodes it); "null" without calls.
	Usage Output
	// Sandbox is the conversation sandbox the run ran in ("" for a sandbox
	// of its own); SandboxNote why it waited for one, or why one was
	// stopped for it or after it.
	Sandbox, SandboxNote string
	// Model and MaxRuntimeSeconds are the overrides of the job that fired
	// it (RunHead.Schedule) it ran with ("" and 0: the agent's).
	Model             string
	MaxRuntimeSeconds int64
	// TraceID is the trace of the run's message (internal/tracing), ""
	// when it was not traced.
	TraceID string
}

// outputs pairs each long text of r with its key on the wire and its name
// for GetRunOutput ("" when GetRunOutput does not page it).
func (r *Run) outputs() []struct {
	key, name string
	out       *Output
} {
	return []struct {
		key, name string
		out       *Output
	}{
		{"text", OutputText, &r.Text}, {"reply", OutputReply, &r.Reply}, {"error", OutputError, &r.Error},
		{"tool_calls", OutputToolCalls, &r.ToolCalls}, {"stderr_tail", OutputStderr, &r.StderrTail},
		{"egress", "", &r.Egress}, {"egress_counts", "", &r.EgressCounts}, {"mcp", "", &r.MCP}, {"usage", "", &r.Usage},
	}
}

// ReadCut replaces each text GetRun cut with the whole of it, read page by
// page with GetRunOutput.
func (r *Run) ReadCut(ctx context.Context, s Scheduler) error {
	for _, o := range r.outputs() {
		if !o.out.Cut || o.name == "" {
			continue
		}
		var whole strings.Builder
		for offset := uint64(0); ; {
			chunk, next, err := s.GetRunOutput(ctx, r.ID, o.name, offset)
			if err != nil {
				return fmt.Errorf("cannot read %s of run %s: %w", o.name, r.ID, err)
			}
			whole.WriteString(chunk)
			if next == 0 || next <= offset {
				break
			}
			offset = next
		}
		o.out.Text, o.out.Cut = whole.String(), false
	}
	return nil
}

// Wire is r as GetRun returns it (a{sv}; the keys the XML lists).
func (r Run) Wire() map[string]dbus.Variant {
	m := r.RunHead.wire()
	m["egress_dropped"] = dbus.MakeVariant(r.EgressDropped)
	m["sandbox"] = dbus.MakeVariant(r.Sandbox)
	m["sandbox_note"] = dbus.MakeVariant(r.SandboxNote)
	m["model"] = dbus.MakeVariant(r.Model)
	m["max_runtime_seconds"] = dbus.MakeVariant(r.MaxRuntimeSeconds)
	m["trace_id"] = dbus.MakeVariant(r.TraceID)
	for _, o := range r.outputs() {
		m[o.key] = dbus.MakeVariant(o.out.Text)
		m[o.key+"_bytes"] = dbus.MakeVariant(o.out.Bytes)
		m[o.key+"_cut"] = dbus.MakeVariant(o.out.Cut)
	}
	return m
}

// RunFromWire reads what GetRun returned.
func RunFromWire(m map[string]dbus.Variant) (Run, error) {
	var r Run
	f := fields{m: m}
	r.RunHead.read(&f)
	f.u32("egress_dropped", &r.EgressDropped)
	f.str("sandbox", &r.Sandbox)
	f.str("sandbox_note", &r.SandboxNote)
	f.str("model", &r.Model)
	f.get("max_runtime_seconds", &r.MaxRuntimeSeconds)
	f.str("trace_id", &r.TraceID)
	for _, o := range r.outputs() {
		f.str(o.key, &o.out.Text)
		f.u32(o.key+"_bytes", &o.out.Bytes)
		f.boolean(o.key+"_cut", &o.out.Cut)
	}
	if f.err != nil {
		return Run{}, fmt.Errorf("cannot read run: %w", f.err)
	}
	return r, nil
}

func (h *RunHead) wire() map[string]dbus.Variant {
	return map[string]dbus.Variant{
		"id":            dbus.MakeVariant(h.ID),
		"message_id":    dbus.MakeVariant(h.MessageID),
		"agent":         dbus.MakeVariant(h.Agent),
		"state":         dbus.MakeVariant(h.State),
		"reason":        dbus.MakeVariant(h.Reason),
		"connector":     dbus.MakeVariant(h.Connector),
		"channel":       dbus.MakeVariant(h.Channel),
		"thread":        dbus.MakeVariant(h.Thread),
		"author":        dbus.MakeVariant(h.Author),
		"attempts":      dbus.MakeVariant(h.Attempts),
		"backend":       dbus.MakeVariant(h.Backend),
		"created_usec":  usecVariant(h.CreatedAt),
		"started_usec":  usecVariant(h.StartedAt),
		"finished_usec": usecVariant(h.FinishedAt),
		"delivered":     dbus.MakeVariant(h.Delivered),
		"schedule":      dbus.MakeVariant(h.Schedule),
	}
}

func (h *RunHead) read(f *fields) {
	f.str("id", &h.ID)
	f.str("message_id", &h.MessageID)
	f.str("agent", &h.Agent)
	f.str("state", &h.State)
	f.str("reason", &h.Reason)
	f.str("connector", &h.Connector)
	f.str("channel", &h.Channel)
	f.str("thread", &h.Thread)
	f.str("author", &h.Author)
	f.u32("attempts", &h.Attempts)
	f.str("backend", &h.Backend)
	f.usec("created_usec", &h.CreatedAt)
	f.usec("started_usec", &h.StartedAt)
	f.usec("finished_usec", &h.FinishedAt)
	f.boolean("delivered", &h.Delivered)
	f.str("schedule", &h.Schedule)
}

// RunSummary is one entry of dev.berth.Scheduler1.ListRuns.
type RunSummary struct {
	RunHead
	TextPreview  string // at most 200 characters
	ReplyPreview string
	TextBytes    uint32
	ReplyBytes   uint32
}

// Wire is s as ListRuns returns it.
func (s RunSummary) Wire() map[string]dbus.Variant {
	m := s.RunHead.wire()
	m["text_preview"] = dbus.MakeVariant(s.TextPreview)
	m["reply_preview"] = dbus.MakeVariant(s.ReplyPreview)
	m["text_bytes"] = dbus.MakeVariant(s.TextBytes)
	m["reply_bytes"] = dbus.MakeVariant(s.ReplyBytes)
	return m
}

// RunSummaryFromWire reads one entry of what ListRuns returned.
func RunSummaryFromWire(m map[string]dbus.Variant) (RunSummary, error) {
	var s RunSummary
	f := fields{m: m}
	s.RunHead.read(&f)
	f.str("text_preview", &s.TextPreview)
	f.str("reply_preview", &s.ReplyPreview)
	f.u32("text_bytes", &s.TextBytes)
	f.u32("reply_bytes", &s.ReplyBytes)
	if f.err != nil {
		return RunSummary{}, fmt.Errorf("cannot read run summary: %w", f.err)
	}
	return s, nil
}

// ListFilter selects ListRuns' runs; zero fields do not filter.
type ListFilter struct {
	State    string
	Agent    string
	Schedule string // the runs the [[schedules]] job fired
	Limit    uint32 // 0: the scheduler's default (50); at most 500
	Before   string // a run id: the runs after it, for the next page
}

// Wire is f as ListRuns takes it (a{sv}, only the keys set).
func (f ListFilter) Wire() map[string]dbus.Variant {
	m := map[string]dbus.Variant{}
	if f.State != "" {
		m["state"] = dbus.MakeVariant(f.State)
	}
	if f.Agent != "" {
		m["agent"] = dbus.MakeVariant(f.Agent)
	}
	if f.Schedule != "" {
		m["schedule"] = dbus.MakeVariant(f.Schedule)
	}
	if f.Limit != 0 {
		m["limit"] = dbus.MakeVariant(f.Limit)
	}
	if f.Before != "" {
		m["before"] = dbus.MakeVariant(f.Before)
	}
	return m
}

// ListFilterFromWire reads a ListRuns filter; an unknown key or a value of
// the wrong type is refused.
func ListFilterFromWire(m map[string]dbus.Variant) (ListFilter, error) {
	var lf ListFilter
	for key, v := range m {
		var err error
		switch key {
		case "state":
			err = dbus.Store([]any{v.Value()}, &lf.State)
		case "agent":
			err = dbus.Store([]any{v.Value()}, &lf.Agent)
		case "schedule":
			err = dbus.Store([]any{v.Value()}, &lf.Schedule)
		case "before":
			err = dbus.Store([]any{v.Value()}, &lf.Before)
		case "limit":
			err = dbus.Store([]any{v.Value()}, &lf.Limit)
		default:
			return ListFilter{}, invalid("unknown filter key %q (known: state, agent, schedule, limit, before)", key)
		}
		if err != nil {
			return ListFilter{}, invalid("filter %s has type %s: %v", key, v.Signature(), err)
		}
	}
	return lf, nil
}

// ProviderResult is one provider check of dev.berth.Scheduler1.TestProviders.
type ProviderResult struct {
	Name      string
	Kind      string
	Model     string
	BaseURL   string
	Status    string // ok | unreachable | auth failed | model not found | error
	Detail    string
	LatencyMS uint32
}

// Wire is p as TestProviders returns it (a{sv}).
func (p ProviderResult) Wire() map[string]dbus.Variant {
	return map[string]dbus.Variant{
		"name":       dbus.MakeVariant(p.Name),
		"kind":       dbus.MakeVariant(p.Kind),
		"model":      dbus.MakeVariant(p.Model),
		"base_url":   dbus.MakeVariant(p.BaseURL),
		"status":     dbus.MakeVariant(p.Status),
		"detail":     dbus.MakeVariant(p.Detail),
		"latency_ms": dbus.MakeVariant(p.LatencyMS),
	}
}

// ProviderResultFromWire reads one entry of what TestProviders returned.
func ProviderResultFromWire(m map[string]dbus.Variant) (ProviderResult, error) {
	var p ProviderResult
	f := fields{m: m}
	f.str("name", &p.Name)
	f.str("kind", &p.Kind)
	f.str("model", &p.Model)
	f.str("base_url", &p.BaseURL)
	f.str("status", &p.Status)
	f.str("detail", &p.Detail)
	f.u32("latency_ms", &p.LatencyMS)
	if f.err != nil {
		return ProviderResult{}, fmt.Errorf("cannot read provider result: %w", f.err)
	}
	return p, nil
}

// Plain is r's wire form with plain values (its keys as the XML names
// them): what berthctl prints as JSON.
func (r Run) Plain() map[string]any { return plain(r.Wire()) }

// Plain is s's wire form with plain values, as Run.Plain.
func (s RunSummary) Plain() map[string]any { return plain(s.Wire()) }
