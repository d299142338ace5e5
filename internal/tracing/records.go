package tracing

import (
	"maps"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
)

// Span names of the scheduler's replay of what a run's egress proxy decided.
const SpanEgress = "egress.decision"

// MaxEgressSpans caps the spans made of one run's egress decisions.
const MaxEgressSpans = 128

// AgentRecords are the records of berth-agent's span records, to replay
// under the run's span, which ran from start to end. The records come from
// the sandbox: the caps are applied again (at most agentproto.MaxSpans
// records of at most MaxSpanAttributes attributes, each text cut to
// MaxSpanText bytes), every time is clamped into [start, end], and a
// parent that is not an earlier record becomes the run's span.
func AgentRecords(recs []agentproto.SpanRecord, start, end time.Time) []Record {
	if end.Before(start) {
		end = start
	}
	recs = recs[:min(len(recs), agentproto.MaxSpans)]
	out := make([]Record, 0, len(recs))
	for i, r := range recs {
		parent := r.Parent
		if parent < 0 || parent >= i {
			parent = -1
		}
		keys := slices.Sorted(maps.Keys(r.Attributes))
		attrs := make([]attribute.KeyValue, 0, min(len(keys), agentproto.MaxSpanAttributes))
		for _, k := range keys[:min(len(keys), agentproto.MaxSpanAttributes)] {
			attrs = append(attrs, attribute.String(cut(k), cut(r.Attributes[k])))
		}
		s, e := clamp(r.Start, start, end), clamp(r.End, start, end)
		if e.Before(s) {
			e = s
		}
		out = append(out, Record{Name: cut(r.Name), Parent: parent, Start: s, End: e, Attributes: attrs, Error: cut(r.Error)})
	}
	return out
}

// EgressRecords appends to recs (the agent's, as AgentRecords made them)
// one record per egress decision, at most MaxEgressSpans, each a child of
// the model or tool call whose time contains it (the innermost, the latest
// to start), else of the agent's loop, else of the run's span. A decision
// names its method, host, port, verdict and rule; never its path, which may
// carry what the agent sent.
func EgressRecords(recs []Record, decisions []egresspolicy.Decision, start, end time.Time) []Record {
	n := len(recs)
	for _, d := range decisions[:min(len(decisions), MaxEgressSpans)] {
		at := clamp(d.Time, start, end)
		parent := -1
		for i := n - 1; i >= 0; i-- {
			if !at.Before(recs[i].Start) && !at.After(recs[i].End) {
				if parent < 0 || recs[i].Start.After(recs[parent].Start) {
					parent = i
				}
			}
		}
		verdict := "allowed"
		if !d.Allowed {
			verdict = "refused"
		}
		attrs := []attribute.KeyValue{
			attribute.String("http.request.method", cut(d.Method)),
			attribute.String("server.address", cut(d.Host)),
			attribute.String("server.port", strconv.Itoa(d.Port)),
			attribute.String("berth.egress.verdict", verdict),
		}
		if d.Rule != "" {
			attrs = append(attrs, attribute.String("berth.egress.rule", cut(d.Rule)))
		}
		rec := Record{Name: SpanEgress, Parent: parent, Start: at, End: at, Attributes: attrs}
		if !d.Allowed {
			rec.Error = cut(d.Reason)
		}
		recs = append(recs, rec)
	}
	return recs
}

func clamp(t, lo, hi time.Time) time.Time {
	switch {
	case t.IsZero() || t.Before(lo):
		return lo
	case t.After(hi):
		return hi
	}
	return t
}

// cut is s cut to agentproto.MaxSpanText bytes at a rune boundary.
func cut(s string) string {
	n := agentproto.MaxSpanText
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
