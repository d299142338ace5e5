package busapi

import "testing"

// The trace context crosses the bus in Submit, Deliver and GetRun, and a
// peer that sends none (an older build, tracing off) sends no key.
func TestTheTraceContextCrossesTheBusAndIsLeftOutWhenThereIsNone(t *testing.T) {
	t.Parallel()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sub := Submission{MessageID: "m1", Agent: "a", Connector: "hooks", Traceparent: tp}
	if got := SubmissionFromWire(sub.Wire()).Traceparent; got != tp {
		t.Errorf("Submission traceparent after the wire = %q", got)
	}
	if _, ok := (Submission{MessageID: "m1", Agent: "a"}).Wire()["traceparent"]; ok {
		t.Error("a Submission without a trace sends a traceparent key")
	}
	rep := Reply{RunID: "r1", MessageID: "m1", Connector: "hooks", Traceparent: tp}
	if got := ReplyFromWire(rep.Wire()).Traceparent; got != tp {
		t.Errorf("Reply traceparent after the wire = %q", got)
	}
	if _, ok := (Reply{RunID: "r1"}).Wire()["traceparent"]; ok {
		t.Error("a Reply without a trace sends a traceparent key")
	}
	run := Run{RunHead: RunHead{ID: "r1"}, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
	back, err := RunFromWire(run.Wire())
	if err != nil || back.TraceID != run.TraceID {
		t.Errorf("Run trace_id after the wire = %q (%v)", back.TraceID, err)
	}
}
