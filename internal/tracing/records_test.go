package tracing_test

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/agentproto"
	"github.com/berth-dev/berth/internal/egresspolicy"
	"github.com/berth-dev/berth/internal/tracing"
)

// What berth-agent reports comes from the sandbox: the scheduler holds it
// to the caps again, clamps its times into the run's and mends parents
// that point forward or nowhere.
func TestAgentRecordsAreHeldToTheCapsAndTheRunsTime(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	start, end := t0, t0.Add(10*time.Second)
	long := strings.Repeat("é", agentproto.MaxSpanText) // 2 bytes each
	attrs := map[string]string{}
	for i := range agentproto.MaxSpanAttributes + 5 {
		attrs[string(rune('a'+i))] = long
	}
	recs := make([]agentproto.SpanRecord, agentproto.MaxSpans+10)
	for i := range recs {
		recs[i] = agentproto.SpanRecord{Name: "x", Parent: i - 1, Start: t0.Add(time.Second), End: t0.Add(2 * time.Second)}
	}
	recs[0] = agentproto.SpanRecord{Name: long, Parent: 5, Start: t0.Add(-time.Hour), End: t0.Add(time.Hour), Attributes: attrs, Error: long}
	recs[1].Parent = 1 // itself
	recs[2].Start, recs[2].End = t0.Add(3*time.Second), t0.Add(2*time.Second)

	got := tracing.AgentRecords(recs, start, end)
	if len(got) != agentproto.MaxSpans {
		t.Fatalf("%d records, want the cap %d", len(got), agentproto.MaxSpans)
	}
	r0 := got[0]
	if r0.Parent != -1 || got[1].Parent != -1 || got[3].Parent != 2 {
		t.Errorf("parents %d %d %d, want -1 (forward), -1 (itself), 2", r0.Parent, got[1].Parent, got[3].Parent)
	}
	if !r0.Start.Equal(start) || !r0.End.Equal(end) {
		t.Errorf("times %v–%v not clamped into the run's %v–%v", r0.Start, r0.End, start, end)
	}
	if got[2].End.Before(got[2].Start) {
		t.Errorf("a record ends before it starts: %v–%v", got[2].Start, got[2].End)
	}
	if len(r0.Attributes) != agentproto.MaxSpanAttributes {
		t.Errorf("%d attributes, want the cap %d", len(r0.Attributes), agentproto.MaxSpanAttributes)
	}
	for _, s := range []string{r0.Name, r0.Error, r0.Attributes[0].Value.AsString()} {
		if len(s) > agentproto.MaxSpanText || !strings.HasPrefix(long, s) {
			t.Errorf("text of %d bytes not cut to %d at a rune: %q…", len(s), agentproto.MaxSpanText, s[:8])
		}
	}
}

// Egress decisions hang under the latest-starting call whose time holds
// them, name no path, and stop at MaxEgressSpans.
func TestEgressRecordsHangUnderTheCallThatHoldsThem(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	agent := tracing.AgentRecords([]agentproto.SpanRecord{
		{Name: agentproto.SpanLoop, Parent: -1, Start: t0, End: t0.Add(10 * time.Second)},
		{Name: agentproto.SpanLLM, Parent: 0, Start: t0.Add(time.Second), End: t0.Add(2 * time.Second)},
		{Name: agentproto.SpanTool, Parent: 0, Start: t0.Add(3 * time.Second), End: t0.Add(5 * time.Second)},
	}, t0, t0.Add(20*time.Second))
	decisions := []egresspolicy.Decision{
		{Time: t0.Add(1500 * time.Millisecond), Method: "POST", Host: "api.example", Port: 443, Path: "/v1/secret-path", Allowed: true, Rule: "provider gpt"},
		{Time: t0.Add(4 * time.Second), Method: "GET", Host: "files.example", Port: 80, Path: "/secret-path", Reason: "no rule"},
		{Time: t0.Add(8 * time.Second), Method: "GET", Host: "a.example", Port: 80},
		{Time: t0.Add(15 * time.Second), Method: "GET", Host: "b.example", Port: 80},
	}
	got := tracing.EgressRecords(agent, decisions, t0, t0.Add(20*time.Second))[len(agent):]
	wantParents := []int{1, 2, 0, -1}
	for i, r := range got {
		if r.Parent != wantParents[i] {
			t.Errorf("decision %d has parent %d, want %d", i, r.Parent, wantParents[i])
		}
		for _, a := range r.Attributes {
			if strings.Contains(a.Value.AsString(), "secret-path") {
				t.Errorf("decision %d names its path in %s", i, a.Key)
			}
		}
	}
	if got[1].Error != "no rule" || got[0].Error != "" {
		t.Errorf("a refusal is not failed with its reason: %+v %+v", got[0], got[1])
	}
	many := make([]egresspolicy.Decision, tracing.MaxEgressSpans+50)
	if n := len(tracing.EgressRecords(nil, many, t0, t0)); n != tracing.MaxEgressSpans {
		t.Errorf("%d egress records, want the cap %d", n, tracing.MaxEgressSpans)
	}
}
