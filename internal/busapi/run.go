package busapi

import (
	"fmt"
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

// Run is one run as dev.berth.Scheduler1.GetRun returns it.
type Run struct {
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
	CreatedAt  time.Time
	StartedAt  time.Time
	FinishedAt time.Time
	Delivered  bool
	Backend    string

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
}

// outputs pairs each long text of r with its key on the wire.
func (r *Run) outputs() []struct {
	key string
	out *Output
} {
	return []struct {
		key string
		out *Output
	}{
		{"text", &r.Text}, {"reply", &r.Reply}, {"error", &r.Error}, {"tool_calls", &r.ToolCalls},
		{"stderr_tail", &r.StderrTail}, {"egress", &r.Egress}, {"egress_counts", &r.EgressCounts},
	}
}

// Wire is r as GetRun returns it (a{sv}; the keys the XML lists).
func (r Run) Wire() map[string]dbus.Variant {
	m := r.head().wire()
	m["egress_dropped"] = dbus.MakeVariant(r.EgressDropped)
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
	r.head().read(&f)
	f.u32("egress_dropped", &r.EgressDropped)
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

// runHead points at what Run and RunSummary both carry, so that the keys of
// the two records are named once and cannot drift apart.
type runHead struct {
	id, messageID, agent, state, reason, connector, channel, thread, author, backend *string
	attempts                                                                         *uint32
	created, started, finished                                                       *time.Time
	delivered                                                                        *bool
}

func (r *Run) head() runHead {
	return runHead{&r.ID, &r.MessageID, &r.Agent, &r.State, &r.Reason, &r.Connector, &r.Channel, &r.Thread, &r.Author, &r.Backend,
		&r.Attempts, &r.CreatedAt, &r.StartedAt, &r.FinishedAt, &r.Delivered}
}

func (s *RunSummary) head() runHead {
	return runHead{&s.ID, &s.MessageID, &s.Agent, &s.State, &s.Reason, &s.Connector, &s.Channel, &s.Thread, &s.Author, &s.Backend,
		&s.Attempts, &s.CreatedAt, &s.StartedAt, &s.FinishedAt, &s.Delivered}
}

func (h runHead) wire() map[string]dbus.Variant {
	return map[string]dbus.Variant{
		"id":            dbus.MakeVariant(*h.id),
		"message_id":    dbus.MakeVariant(*h.messageID),
		"agent":         dbus.MakeVariant(*h.agent),
		"state":         dbus.MakeVariant(*h.state),
		"reason":        dbus.MakeVariant(*h.reason),
		"connector":     dbus.MakeVariant(*h.connector),
		"channel":       dbus.MakeVariant(*h.channel),
		"thread":        dbus.MakeVariant(*h.thread),
		"author":        dbus.MakeVariant(*h.author),
		"attempts":      dbus.MakeVariant(*h.attempts),
		"backend":       dbus.MakeVariant(*h.backend),
		"created_usec":  usecVariant(*h.created),
		"started_usec":  usecVariant(*h.started),
		"finished_usec": usecVariant(*h.finished),
		"delivered":     dbus.MakeVariant(*h.delivered),
	}
}

func (h runHead) read(f *fields) {
	f.str("id", h.id)
	f.str("message_id", h.messageID)
	f.str("agent", h.agent)
	f.str("state", h.state)
	f.str("reason", h.reason)
	f.str("connector", h.connector)
	f.str("channel", h.channel)
	f.str("thread", h.thread)
	f.str("author", h.author)
	f.u32("attempts", h.attempts)
	f.str("backend", h.backend)
	f.usec("created_usec", h.created)
	f.usec("started_usec", h.started)
	f.usec("finished_usec", h.finished)
	f.boolean("delivered", h.delivered)
}

// RunSummary is one entry of dev.berth.Scheduler1.ListRuns.
type RunSummary struct {
	ID           string
	MessageID    string
	Agent        string
	State        string
	Reason       string
	Connector    string
	Channel      string
	Thread       string
	Author       string
	Attempts     uint32
	Backend      string
	CreatedAt    time.Time
	StartedAt    time.Time
	FinishedAt   time.Time
	Delivered    bool
	TextPreview  string // at most 200 characters
	ReplyPreview string
	TextBytes    uint32
	ReplyBytes   uint32
}

// Wire is s as ListRuns returns it.
func (s RunSummary) Wire() map[string]dbus.Variant {
	m := s.head().wire()
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
	s.head().read(&f)
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
	State  string
	Agent  string
	Limit  uint32 // 0: the scheduler's default (50); at most 500
	Before string // a run id: the runs after it, for the next page
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
		case "before":
			err = dbus.Store([]any{v.Value()}, &lf.Before)
		case "limit":
			err = dbus.Store([]any{v.Value()}, &lf.Limit)
		default:
			return ListFilter{}, invalid("unknown filter key %q (known: state, agent, limit, before)", key)
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
