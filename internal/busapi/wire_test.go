package busapi

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
)

func TestSubmissionCrossesTheWireWithItsConnectorPrefixedKey(t *testing.T) {
	t.Parallel()
	s := Submission{MessageID: "m-1", Agent: "alpha", Connector: "hooks", Channel: "C1", ChannelName: "general", Thread: "t", Author: "ann", Text: "hi"}
	wire := s.Wire()
	if wire["id"] != "hooks/m-1" {
		t.Fatalf("wire id = %q, want the key hooks/m-1 (what intake always sent)", wire["id"])
	}
	got := SubmissionFromWire(wire)
	if got.Key() != s.Key() {
		t.Fatalf("key after the round trip = %q, want %q", got.Key(), s.Key())
	}
	if got.sentKey = ""; !reflect.DeepEqual(got, s) {
		t.Fatalf("round trip = %+v, want %+v", got, s)
	}
	tests := []struct {
		name string
		wire map[string]string
		key  string
	}{
		{"Key_of_a_message_without_a_connector_is_its_id", map[string]string{"id": "hooks/m1", "agent": "a"}, "hooks/m1"},
		{"Prefixed_id_is_read_as_the_platforms_id", map[string]string{"id": "dc/42", "connector": "dc", "agent": "a"}, "dc/42"},
		{"Unprefixed_id_of_a_connector_keeps_the_senders_key", map[string]string{"id": "42", "connector": "dc", "agent": "a"}, "42"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := SubmissionFromWire(tc.wire).Key(); got != tc.key {
				t.Fatalf("Key() = %q, want %q", got, tc.key)
			}
		})
	}
}

func TestReplyCarriesThePlatformsMessageIDAndTheKeyOnTheWire(t *testing.T) {
	t.Parallel()
	r := Reply{RunID: "r1", MessageID: "m-1", Connector: "hooks", Agent: "alpha", Channel: "C1", Thread: "t", State: StateSucceeded, Text: "ok", Error: ""}
	if r.Wire()["message_id"] != "hooks/m-1" {
		t.Fatalf("wire message_id = %q, want hooks/m-1", r.Wire()["message_id"])
	}
	if got := ReplyFromWire(r.Wire()); !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip = %+v, want %+v", got, r)
	}
}

func TestRunAndSummaryRoundTripThroughTheirWireForm(t *testing.T) {
	t.Parallel()
	at := time.UnixMicro(1_700_000_000_123_456).UTC()
	r := Run{RunHead: RunHead{ID: "r1", MessageID: "hooks/m1", Agent: "alpha", State: StateFailed, Reason: "timeout", Connector: "hooks",
		Attempts: 2, CreatedAt: at, StartedAt: at.Add(time.Second), Delivered: true, Backend: "landlock", Schedule: "standup"}, EgressDropped: 3,
		Text: Output{Text: "hi", Bytes: 2}, Reply: Output{Text: "cut", Bytes: 5 << 20, Cut: true}, ToolCalls: Output{Text: "[]", Bytes: 2},
		Model: "small", MaxRuntimeSeconds: 600}
	got, err := RunFromWire(r.Wire())
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip = %+v (%v), want %+v", got, err, r)
	}
	s := RunSummary{RunHead: RunHead{ID: "r1", Agent: "alpha", State: StateQueued, CreatedAt: at, Schedule: "standup"}, TextPreview: "hi", TextBytes: 2}
	gotSum, err := RunSummaryFromWire(s.Wire())
	if err != nil || gotSum != s {
		t.Fatalf("round trip = %+v (%v), want %+v", gotSum, err, s)
	}
	if _, err := RunFromWire(map[string]dbus.Variant{"attempts": dbus.MakeVariant("two")}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a run with attempts of type s = %v, want ErrInvalid", err)
	}
}

func TestProviderResultConnectorStatusAndImageRoundTrip(t *testing.T) {
	t.Parallel()
	p := ProviderResult{Name: "claude", Kind: "anthropic", Model: "m", Status: "ok", LatencyMS: 120}
	if got, err := ProviderResultFromWire(p.Wire()); err != nil || got != p {
		t.Fatalf("provider round trip = %+v (%v), want %+v", got, err, p)
	}
	c := ConnectorStatus{ID: "dc", Type: "discord", State: "connected", Reconnects: 3, Warning: "intent"}
	if got, err := ConnectorsFromWire(dbus.MakeVariant([]map[string]dbus.Variant{c.Wire()})); err != nil || len(got) != 1 || got[0] != c {
		t.Fatalf("connector round trip = %+v (%v), want %+v", got, err, c)
	}
	if _, err := ConnectorsFromWire(dbus.MakeVariant("x")); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "want aa{sv}") {
		t.Fatalf("a Connectors property of type s = %v, want ErrInvalid naming the expected type", err)
	}
	img := Image{Tag: "t", Kind: "sandbox", Status: "ready", Present: true, Size: 5, Agents: []string{"a"}, Inputs: map[string]string{"k": "v"}, LogTail: []string{}}
	if got, err := ImageFromWire(img.Wire()); err != nil || !reflect.DeepEqual(got, img) {
		t.Fatalf("image round trip = %+v (%v), want %+v", got, err, img)
	}
	if _, err := BuildTargetFromWire(map[string]dbus.Variant{"colour": dbus.MakeVariant("red")}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("an unknown build option = %v, want ErrInvalid", err)
	}
}

func TestListFilterRefusesUnknownKeysAndWrongTypes(t *testing.T) {
	t.Parallel()
	f := ListFilter{State: "queued", Agent: "alpha", Schedule: "standup", Limit: 7, Before: "r9"}
	if got, err := ListFilterFromWire(f.Wire()); err != nil || got != f {
		t.Fatalf("round trip = %+v (%v), want %+v", got, err, f)
	}
	for _, bad := range []map[string]dbus.Variant{
		{"colour": dbus.MakeVariant("red")},
		{"limit": dbus.MakeVariant("ten")},
	} {
		if _, err := ListFilterFromWire(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("filter %v = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestExplanationAndEgressVerdictRoundTripThroughTheirJSON(t *testing.T) {
	t.Parallel()
	e := Explanation{
		Plan: Plan{Backend: BackendContainer, AgentID: "alpha", User: &RunUser{Name: "u", UID: 7}, Limits: Limits{MemoryBytes: 256 << 20},
			Mounts: []Mount{{Source: "/srv", Target: "/data", ReadOnly: true}}, Providers: []Provider{{Name: "cloud", Kind: "openai"}},
			Egress:  &EgressPlan{Allow: []EgressRule{{Raw: "pypi.org", Host: "pypi.org"}}, Secrets: []EgressSecret{{Name: "gh", Hosts: []string{"api.github.com"}}}},
			Timeout: time.Minute},
		Why: map[string]string{"backend": "configured"}, Problems: []string{"no key"}, BackendAvailable: true,
		Confinement: &Confinement{Mode: "container", Holds: []string{"NetworkMode=none"}},
	}
	if got, err := ExplanationFromWire(e.Wire()); err != nil || !reflect.DeepEqual(got, e) {
		t.Fatalf("explanation round trip = %+v (%v), want %+v", got, err, e)
	}
	v := EgressVerdict{Method: "CONNECT", URL: "https://pypi.org/", Allowed: true, Rule: "pypi.org", Reason: "allowed by rule pypi.org", Agent: "alpha", Network: "none"}
	if got, err := EgressVerdictFromWire(v.Wire()); err != nil || got != v {
		t.Fatalf("verdict round trip = %+v (%v), want %+v", got, err, v)
	}
	if _, err := ExplanationFromWire("plan"); !errors.Is(err, ErrInvalid) {
		t.Errorf("a plan that is not JSON = %v, want ErrInvalid", err)
	}
	if _, err := EgressVerdictFromWire(`{"allowed":"yes"}`); !errors.Is(err, ErrInvalid) {
		t.Errorf("a verdict with allowed of the wrong type = %v, want ErrInvalid", err)
	}
}

func TestARunsEgressAndToolCallsDecodeFromItsRecord(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	decisions := []EgressDecision{{Time: at, Method: "CONNECT", Host: "pypi.org", Port: 443, Allowed: true, Rule: "pypi.org", BytesUp: 10}}
	counts := &EgressCounts{Allowed: 1, Hosts: []EgressHostCount{{Host: "pypi.org", Allowed: 1}}}
	r := Run{Egress: Output{Text: EgressWire(decisions)}, EgressCounts: Output{Text: counts.Wire()},
		ToolCalls: Output{Text: `[{"name":"shell","args":{"command":"ls"},"error":"exit 1"}]`}}
	if got, err := r.EgressDecisions(); err != nil || !reflect.DeepEqual(got, decisions) {
		t.Fatalf("decisions = %+v (%v), want %+v", got, err, decisions)
	}
	if got, err := r.EgressTally(); err != nil || !reflect.DeepEqual(got, *counts) {
		t.Fatalf("counts = %+v (%v), want %+v", got, err, *counts)
	}
	if calls, err := r.Calls(); err != nil || len(calls) != 1 || calls[0].Name != "shell" || string(calls[0].Args) != `{"command":"ls"}` || calls[0].Error != "exit 1" {
		t.Fatalf("tool calls = %+v (%v)", calls, err)
	}
	if EgressWire(nil) != "[]" || (*EgressCounts)(nil).Wire() != "{}" {
		t.Errorf("none on the wire = %s and %s, want [] and {}", EgressWire(nil), (*EgressCounts)(nil).Wire())
	}
	cut := Run{Egress: Output{Text: `[{"time":`, Cut: true}}
	if got, err := cut.EgressDecisions(); err != nil || got != nil {
		t.Errorf("a cut egress text = %+v (%v), want none", got, err)
	}
	broken := Run{EgressCounts: Output{Text: `{"allowed":`}}
	if _, err := broken.EgressTally(); !errors.Is(err, ErrInvalid) {
		t.Errorf("egress counts that are not JSON = %v, want ErrInvalid", err)
	}
}
