package scheduler

import (
	"fmt"
	"slices"
	"strings"

	"github.com/godbus/dbus/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/tracing"
)

// MaxBatch is the most messages one SubmitBatch takes (the interface XML
// says so), so that one call never builds a huge transaction or reply.
const MaxBatch = 512

// SubmitBatch is dev.berth.Scheduler1.SubmitBatch: Submit's callers, many
// messages in one call. Each refused message has, at its index in errors,
// the D-Bus error name Submit would have failed with and its text
// ("dev.berth.Error.InvalidArgument: unknown agent ..."), so the caller
// classifies it as it does a failed Submit; accepted ones have "".
func (o *schedulerObject) SubmitBatch(sender dbus.Sender, wire []map[string]string) ([]string, []string, *dbus.Error) {
	if derr := o.submitters.check(o.conn, sender, o.s.clock.Now()); derr != nil {
		return nil, nil, derr
	}
	if len(wire) > MaxBatch {
		return nil, nil, bus.NewError(bus.ErrInvalidArgument, "%d messages in one SubmitBatch; at most %d", len(wire), MaxBatch)
	}
	msgs := make([]busapi.Submission, len(wire))
	for i, m := range wire {
		msgs[i] = busapi.SubmissionFromWire(m)
	}
	ids, refusals, err := o.s.SubmitBatch(msgs)
	if err != nil {
		return nil, nil, dbusError(err)
	}
	errs := make([]string, len(msgs))
	for i, refused := range refusals {
		if refused != nil {
			errs[i] = busapi.BatchRefusalWire(dbusError(refused))
		}
	}
	return ids, errs, nil
}

// SubmitBatch queues msgs as Submit queues one message each, all in one
// commit, in the order given: an agent's runs are queued in that order. It
// returns each message's run id (the existing run's for a message id
// submitted before, also earlier in the same batch) and, at the same index,
// why a message was refused (ErrInvalidArgument; its run id is ""). The
// error is for the batch as a whole: nothing of it was stored.
func (s *Service) SubmitBatch(msgs []busapi.Submission) ([]string, []error, error) {
	if len(msgs) == 0 {
		return []string{}, []error{}, nil
	}
	known := s.cfg.Load().AgentIDs()
	var (
		runs     []Run
		created  []bool
		refusals []error
	)
	// Called again when the group is applied a second time: every result is
	// set afresh.
	err := s.store.write(func(tx *bolt.Tx) error {
		runs, created, refusals = make([]Run, len(msgs)), make([]bool, len(msgs)), make([]error, len(msgs))
		for i, msg := range msgs {
			r, isNew, refused, err := s.queueMessage(tx, msg, known)
			if err != nil {
				return err
			}
			runs[i], created[i], refusals[i] = r, isNew, refused
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("cannot store runs: %w", err)
	}
	ids := make([]string, len(msgs))
	queued := false
	for i, r := range runs {
		ids[i] = r.ID
		if !created[i] {
			continue
		}
		queued = true
		s.runLog(r).Info("run queued", "message_id", r.MessageID, "connector", r.Connector)
		s.emitStateChanged(r)
	}
	if queued {
		s.publishCounts()
		wake(s.wakeDispatch)
	}
	return ids, refusals, nil
}

// checkMessage refuses a message without an id or an agent.
func checkMessage(msg busapi.Submission) error {
	switch {
	case msg.MessageID == "":
		return fmt.Errorf("%w: message has no id", ErrInvalidArgument)
	case msg.Agent == "":
		return fmt.Errorf("%w: message has no agent", ErrInvalidArgument)
	}
	return nil
}

// queueMessage is one message of Submit or SubmitBatch inside the write
// transaction: the run a message id already has, a refusal (nothing
// written), or a new queued run. err fails the whole transaction.
func (s *Service) queueMessage(tx *bolt.Tx, msg busapi.Submission, known []string) (r Run, created bool, refused, err error) {
	if err := checkMessage(msg); err != nil {
		return Run{}, false, err, nil
	}
	// The key, not the platform's id: messages of two connectors may share
	// an id. Runs record it as their message id, as they always did.
	id, agent := msg.Key(), msg.Agent
	// The idempotency lookup comes before the agent check: a retried
	// message that was taken gets its run id even if its agent has since
	// been removed from the config.
	if existing := messagesBucket(tx).Get([]byte(id)); existing != nil {
		return Run{ID: string(existing)}, false, nil, nil
	}
	if !slices.Contains(known, agent) {
		return Run{}, false, fmt.Errorf("%w: unknown agent %q (configured agents: %s)", ErrInvalidArgument, agent, strings.Join(known, ", ")), nil
	}
	seq, err := queueBucket(tx).NextSequence()
	if err != nil {
		return Run{}, false, nil, fmt.Errorf("cannot number run: %w", err)
	}
	// The time is the committer's, so that run ids (which sort by creation
	// time) follow the queue's order.
	now := s.clock.Now()
	r = Run{
		ID:          newRunID(now),
		MessageID:   cleanText(id),
		Agent:       agent,
		Connector:   cleanText(msg.Connector),
		Channel:     cleanText(msg.Channel),
		ChannelName: cleanText(msg.ChannelName),
		Thread:      cleanText(msg.Thread),
		Author:      cleanText(msg.Author),
		Text:        cleanText(msg.Text),
		Files:       runFiles(msg.Files),
		State:       StateQueued,
		Traceparent: traceparentOf(msg.Traceparent),
		TraceID:     tracing.SampledTraceID(msg.Traceparent),
		CreatedAt:   now,
		Seq:         seq,
	}
	if err := putRun(tx, r); err != nil {
		return Run{}, false, nil, err
	}
	if err := messagesBucket(tx).Put([]byte(id), []byte(r.ID)); err != nil {
		return Run{}, false, nil, fmt.Errorf("cannot index message id: %w", err)
	}
	return r, true, nil, nil
}

func runFiles(files []busapi.File) []RunFile {
	if len(files) == 0 {
		return nil
	}
	out := make([]RunFile, len(files))
	for i, f := range files {
		out[i] = RunFile{Name: f.Name, Type: cleanText(f.Type), Size: f.Size}
	}
	return out
}
