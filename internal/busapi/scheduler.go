package busapi

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
)

// Scheduler is a client of dev.berth.Scheduler1. Calls may start the
// scheduler by D-Bus activation.
type Scheduler struct {
	conn *dbus.Conn
}

// NewScheduler is a client of the scheduler on conn.
func NewScheduler(conn *dbus.Conn) Scheduler { return Scheduler{conn: conn} }

func (s Scheduler) call(ctx context.Context, method string, args []any, results ...any) error {
	return call(ctx, s.conn.Object(bus.SchedulerName, bus.SchedulerPath), 0, bus.SchedulerInterface, method, args, results...)
}

// Submit queues one message and returns its run id; the same message
// (Submission.Key) returns the same run.
func (s Scheduler) Submit(ctx context.Context, msg Submission) (string, error) {
	if len(msg.Files) > 0 {
		return s.SubmitFiles(ctx, msg)
	}
	var runID string
	if err := s.call(ctx, "Submit", []any{msg.Wire()}, &runID); err != nil {
		return "", err
	}
	if runID == "" {
		return "", fmt.Errorf("the scheduler answered an empty run id")
	}
	return runID, nil
}

// SubmitFiles is Submit for a message with files (msg.Files): the
// scheduler has its own copy of every file once it returns, and the caller
// still closes them.
func (s Scheduler) SubmitFiles(ctx context.Context, msg Submission) (string, error) {
	var runID string
	if err := s.call(ctx, "SubmitFiles", []any{msg.Wire(), FilesWire(msg.Files)}, &runID); err != nil {
		return "", err
	}
	if runID == "" {
		return "", fmt.Errorf("the scheduler answered an empty run id")
	}
	return runID, nil
}

// SubmitBatch is Submit for many messages in one commit. It returns each
// message's run id or, at the same index, why it was refused: the
// dbus.Error Submit would have failed with. err is for the call as a whole.
func (s Scheduler) SubmitBatch(ctx context.Context, msgs []Submission) ([]string, []error, error) {
	wire := make([]map[string]string, len(msgs))
	for i, m := range msgs {
		wire[i] = m.Wire()
	}
	var runIDs, refusals []string
	if err := s.call(ctx, "SubmitBatch", []any{wire}, &runIDs, &refusals); err != nil {
		return nil, nil, err
	}
	if len(runIDs) != len(msgs) || len(refusals) != len(msgs) {
		return nil, nil, fmt.Errorf("the scheduler answered %d run ids and %d errors for %d messages", len(runIDs), len(refusals), len(msgs))
	}
	errs := make([]error, len(msgs))
	for i, refusal := range refusals {
		switch {
		case refusal != "":
			errs[i] = BatchRefusalFromWire(refusal)
		case runIDs[i] == "":
			errs[i] = fmt.Errorf("the scheduler answered an empty run id")
		}
	}
	return runIDs, errs, nil
}

// BatchRefusalWire is how SubmitBatch reports a refused message:
// "<D-Bus error name>: <text>".
func BatchRefusalWire(derr *dbus.Error) string {
	return derr.Name + ": " + fmt.Sprint(derr.Body...)
}

// BatchRefusalFromWire is the dbus.Error a SubmitBatch refusal stands for,
// so that it classifies as the same Submit's error would.
func BatchRefusalFromWire(refusal string) error {
	name, text, ok := strings.Cut(refusal, ": ")
	if !ok {
		name, text = bus.ErrInternal, refusal
	}
	return dbus.Error{Name: name, Body: []any{text}}
}

// GetRun returns one run; its long texts are cut at 1 MiB (see Output).
func (s Scheduler) GetRun(ctx context.Context, runID string) (Run, error) {
	var m map[string]dbus.Variant
	if err := s.call(ctx, "GetRun", []any{runID}, &m); err != nil {
		return Run{}, err
	}
	return RunFromWire(m)
}

// ListRuns returns one page of runs, newest first.
func (s Scheduler) ListRuns(ctx context.Context, f ListFilter) ([]RunSummary, error) {
	var page []map[string]dbus.Variant
	if err := s.call(ctx, "ListRuns", []any{f.Wire()}, &page); err != nil {
		return nil, err
	}
	return listFromWire(page, RunSummaryFromWire)
}

// Output names of GetRunOutput.
const (
	OutputText      = "text"
	OutputReply     = "reply"
	OutputError     = "error"
	OutputStderr    = "stderr"
	OutputToolCalls = "tool_calls"
)

// GetRunOutput reads a page of one of a run's long texts (what is one of
// the Output names) from offset; next is 0 after the last page.
func (s Scheduler) GetRunOutput(ctx context.Context, runID, what string, offset uint64) (chunk string, next uint64, err error) {
	err = s.call(ctx, "GetRunOutput", []any{runID, what, offset}, &chunk, &next)
	return chunk, next, err
}

// ExplainAgent returns the plan of the agent's next run and why.
func (s Scheduler) ExplainAgent(ctx context.Context, agent string) (Explanation, error) {
	var planJSON string
	if err := s.call(ctx, "ExplainAgent", []any{agent}, &planJSON); err != nil {
		return Explanation{}, err
	}
	return ExplanationFromWire(planJSON)
}

// ProbeMCP asks agent's MCP servers for their tools through a real run.
func (s Scheduler) ProbeMCP(ctx context.Context, agent string) ([]MCPStatus, error) {
	var raw string
	if err := s.call(ctx, "ProbeMCP", []any{agent}, &raw); err != nil {
		return nil, err
	}
	var servers []MCPStatus
	if err := json.Unmarshal([]byte(raw), &servers); err != nil {
		return nil, fmt.Errorf("%w: ProbeMCP's answer: %v", ErrInvalid, err)
	}
	return servers, nil
}

// TestProviders checks the named provider ("" every one) from the scheduler.
func (s Scheduler) TestProviders(ctx context.Context, name string) ([]ProviderResult, error) {
	var raw []map[string]dbus.Variant
	if err := s.call(ctx, "TestProviders", []any{name}, &raw); err != nil {
		return nil, err
	}
	return listFromWire(raw, ProviderResultFromWire)
}

// ExplainEgress says whether the agent's egress proxy would let a request
// of method ("" GET) to url pass, and why.
func (s Scheduler) ExplainEgress(ctx context.Context, agent, method, url string) (EgressVerdict, error) {
	var decisionJSON string
	if err := s.call(ctx, "ExplainEgress", []any{agent, method, url}, &decisionJSON); err != nil {
		return EgressVerdict{}, err
	}
	return EgressVerdictFromWire(decisionJSON)
}

// CancelRun ends a queued or running run as canceled.
func (s Scheduler) CancelRun(ctx context.Context, runID string) error {
	return s.call(ctx, "CancelRun", []any{runID})
}

// SchedulerStatus holds the scheduler's properties.
type SchedulerStatus struct {
	QueueDepth  uint32
	Running     uint32
	Quarantined uint32
}

// Properties reads the scheduler's properties without starting it.
func (s Scheduler) Properties(ctx context.Context) (SchedulerStatus, error) {
	props, err := getAll(ctx, s.conn.Object(bus.SchedulerName, bus.SchedulerPath), bus.SchedulerInterface)
	if err != nil {
		return SchedulerStatus{}, err
	}
	var st SchedulerStatus
	f := fields{m: props}
	f.u32("QueueDepth", &st.QueueDepth)
	f.u32("Running", &st.Running)
	f.u32("Quarantined", &st.Quarantined)
	return st, f.err
}

// RunEnded is one RunFinished signal.
type RunEnded struct {
	RunID, Agent, State, Reason string
}

// RunFinished subscribes to RunFinished and delivers each signal on the
// channel until ctx is done. Subscribe before submitting, so that the
// signal of the run submitted cannot be missed.
func (s Scheduler) RunFinished(ctx context.Context) (<-chan RunEnded, error) {
	opts := []dbus.MatchOption{dbus.WithMatchInterface(bus.SchedulerInterface), dbus.WithMatchMember("RunFinished"), dbus.WithMatchObjectPath(bus.SchedulerPath)}
	callCtx, cancel := callContext(ctx)
	defer cancel()
	if err := s.conn.AddMatchSignalContext(callCtx, opts...); err != nil {
		return nil, fmt.Errorf("cannot subscribe to RunFinished: %w", err)
	}
	signals := make(chan *dbus.Signal, 64)
	s.conn.Signal(signals)
	out := make(chan RunEnded, 64)
	go func() {
		defer close(out)
		defer s.conn.RemoveSignal(signals)
		for {
			select {
			case <-ctx.Done():
				return
			case sig := <-signals:
				var e RunEnded
				if sig == nil || sig.Name != bus.SchedulerInterface+".RunFinished" || dbus.Store(sig.Body, &e.RunID, &e.Agent, &e.State, &e.Reason) != nil {
					continue
				}
				select {
				case out <- e:
				default: // the caller polls too; a full channel drops the signal
				}
			}
		}
	}()
	return out, nil
}
