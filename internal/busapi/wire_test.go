package busapi

import (
	"errors"
	"reflect"
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
	if got.sentKey = ""; got != s {
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
	if got := ReplyFromWire(r.Wire()); got != r {
		t.Fatalf("round trip = %+v, want %+v", got, r)
	}
}

func TestRunAndSummaryRoundTripThroughTheirWireForm(t *testing.T) {
	t.Parallel()
	at := time.UnixMicro(1_700_000_000_123_456).UTC()
	r := Run{ID: "r1", MessageID: "hooks/m1", Agent: "alpha", State: StateFailed, Reason: "timeout", Connector: "hooks",
		Attempts: 2, CreatedAt: at, StartedAt: at.Add(time.Second), Delivered: true, Backend: "landlock", EgressDropped: 3,
		Text: Output{Text: "hi", Bytes: 2}, Reply: Output{Text: "cut", Bytes: 5 << 20, Cut: true}, ToolCalls: Output{Text: "[]", Bytes: 2}}
	got, err := RunFromWire(r.Wire())
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip = %+v (%v), want %+v", got, err, r)
	}
	s := RunSummary{ID: "r1", Agent: "alpha", State: StateQueued, CreatedAt: at, TextPreview: "hi", TextBytes: 2}
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
	f := ListFilter{State: "queued", Agent: "alpha", Limit: 7, Before: "r9"}
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
