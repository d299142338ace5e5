package busapi

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
)

// RunProgress is one dev.berth.Scheduler1.RunProgress signal: what a run is
// doing now, for the chat message it answers (docs/adr/0027-live-progress.md).
// The scheduler coalesces a run's progress (the latest wins) and sends at
// most one a second per run.
type RunProgress struct {
	RunID string
	// MessageKey is MessageKey(connector, message id) of the run's message.
	MessageKey string
	// Seq is the agent's number of the event shown; it grows within a run.
	Seq uint32
	// Text is the summary a chat user may see ("running `pytest`"): valid
	// UTF-8 on one line, at most agentproto.MaxProgressText bytes, with the
	// run's secrets redacted.
	Text string
}

const runProgressMember = "RunProgress"

// SendRunProgress sends p as a unicast signal to the owner of
// dev.berth.Intake1 alone: it names what a run's tools do, which no other
// client of the bus may read (RunFinished, a broadcast, carries no text).
// No owner, no signal: a signal never starts intake.
func SendRunProgress(conn *dbus.Conn, p RunProgress) error {
	msg := &dbus.Message{
		Type: dbus.TypeSignal,
		Headers: map[dbus.HeaderField]dbus.Variant{
			dbus.FieldPath:        dbus.MakeVariant(bus.SchedulerPath),
			dbus.FieldInterface:   dbus.MakeVariant(bus.SchedulerInterface),
			dbus.FieldMember:      dbus.MakeVariant(runProgressMember),
			dbus.FieldDestination: dbus.MakeVariant(bus.IntakeName),
		},
		Body: []any{p.RunID, p.MessageKey, p.Seq, p.Text},
	}
	msg.Headers[dbus.FieldSignature] = dbus.MakeVariant(dbus.SignatureOf(msg.Body...))
	if call := conn.Send(msg, nil); call.Err != nil {
		return fmt.Errorf("cannot send RunProgress: %w", call.Err)
	}
	return nil
}

// runProgressFromSignal decodes sig, when it is a RunProgress signal.
func runProgressFromSignal(sig *dbus.Signal) (RunProgress, bool) {
	var p RunProgress
	if sig == nil || sig.Path != bus.SchedulerPath || sig.Name != bus.SchedulerInterface+"."+runProgressMember {
		return p, false
	}
	if dbus.Store(sig.Body, &p.RunID, &p.MessageKey, &p.Seq, &p.Text) != nil {
		return p, false
	}
	return p, true
}

// schedulerOwnerRecheck bounds how often a sender that is not the known
// owner of dev.berth.Scheduler1 makes the owner be asked again (after a
// scheduler restart its new connection is another).
const schedulerOwnerRecheck = time.Second

// WatchRunProgress delivers the RunProgress signals that come from the
// owner of dev.berth.Scheduler1 (only root may own it) until ctx is done;
// any other connection's are dropped, whatever they say. A full channel
// drops a signal: the next one of the run carries the latest state.
func WatchRunProgress(ctx context.Context, conn *dbus.Conn) <-chan RunProgress {
	signals := make(chan *dbus.Signal, 256)
	conn.Signal(signals)
	out := make(chan RunProgress, 256)
	owner := &nameOwner{conn: conn, name: bus.SchedulerName}
	go func() {
		defer close(out)
		defer conn.RemoveSignal(signals)
		for {
			select {
			case <-ctx.Done():
				return
			case sig := <-signals:
				p, ok := runProgressFromSignal(sig)
				if !ok || !owner.is(ctx, sig.Sender) {
					continue
				}
				select {
				case out <- p:
				default:
				}
			}
		}
	}()
	return out
}

// nameOwner remembers the unique name owning a well-known name.
type nameOwner struct {
	conn *dbus.Conn
	name string

	mu      sync.Mutex
	owner   string
	checked time.Time
}

func (n *nameOwner) is(ctx context.Context, sender string) bool {
	n.mu.Lock()
	owner, checked := n.owner, n.checked
	n.mu.Unlock()
	if sender != "" && sender == owner {
		return true
	}
	if time.Since(checked) < schedulerOwnerRecheck {
		return false
	}
	callCtx, cancel := callContext(ctx)
	defer cancel()
	var got string
	err := n.conn.BusObject().CallWithContext(callCtx, "org.freedesktop.DBus.GetNameOwner", 0, n.name).Store(&got)
	n.mu.Lock()
	n.checked = time.Now()
	if err == nil {
		n.owner = got
	}
	n.mu.Unlock()
	return err == nil && sender == got
}
