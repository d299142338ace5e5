package intake

import (
	"encoding/xml"
	"errors"
	"fmt"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/introspect"
	"github.com/godbus/dbus/v5/prop"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/units"
)

// intakeObject is dev.berth.Intake1 at /dev/berth/Intake1.
type intakeObject struct {
	service *Service
	conn    *dbus.Conn
	auth    bus.Authorizer
}

// Deliver implements dev.berth.Intake1.Deliver.
func (o *intakeObject) Deliver(sender dbus.Sender, reply map[string]string) *dbus.Error {
	if derr := o.auth.Check(o.conn, sender); derr != nil {
		o.service.log.Warn("Deliver refused", "sender", string(sender), "err", derr)
		return derr
	}
	err := o.service.Deliver(reply)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrInvalidReply):
		return bus.NewError(bus.ErrInvalidArgument, "%v", err)
	default:
		o.service.log.Error("cannot store reply", "err", err)
		return bus.NewError(bus.ErrInternal, "%v", err)
	}
}

// propertySetter publishes the pending counters.
type propertySetter interface {
	setCounts(inbox, outbox uint32)
}

// counterProps publishes the counters through godbus's prop package; a
// change emits PropertiesChanged with the new value (the XML's default).
type counterProps struct {
	props       *prop.Properties
	inbox, outb uint32
}

func (c *counterProps) setCounts(inbox, outbox uint32) {
	if inbox != c.inbox {
		c.inbox = inbox
		c.props.SetMust(bus.IntakeInterface, "InboxPending", inbox)
	}
	if outbox != c.outb {
		c.outb = outbox
		c.props.SetMust(bus.IntakeInterface, "OutboxPending", outbox)
	}
}

// WithAuthorizer sets who may call Deliver (default: root and the service's
// own uid, plus what bus.Authorizer allows).
func WithAuthorizer(a bus.Authorizer) Option { return func(s *Service) { s.auth = a } }

// Export serves dev.berth.Intake1 on conn and then takes the name
// dev.berth.Intake1 (without queueing). Unless WithSubmitter said otherwise,
// messages are submitted to the scheduler over conn.
func (s *Service) Export(conn *dbus.Conn) error {
	node, err := introspectionNode()
	if err != nil {
		return fmt.Errorf("cannot export %s: %w", bus.IntakeInterface, err)
	}
	obj := &intakeObject{service: s, conn: conn, auth: s.auth}
	if err := conn.Export(obj, bus.IntakePath, bus.IntakeInterface); err != nil {
		return fmt.Errorf("cannot export %s: %w", bus.IntakeInterface, err)
	}
	inbox, outbox, err := s.store.pendingCounts()
	if err != nil {
		return fmt.Errorf("cannot export %s: %w", bus.IntakeInterface, err)
	}
	props, err := prop.Export(conn, bus.IntakePath, prop.Map{
		bus.IntakeInterface: {
			"InboxPending":  {Value: inbox, Emit: prop.EmitTrue},
			"OutboxPending": {Value: outbox, Emit: prop.EmitTrue},
		},
	})
	if err != nil {
		return fmt.Errorf("cannot export properties of %s: %w", bus.IntakeInterface, err)
	}
	if err := conn.Export(introspect.NewIntrospectable(node), bus.IntakePath, "org.freedesktop.DBus.Introspectable"); err != nil {
		return fmt.Errorf("cannot export introspection of %s: %w", bus.IntakeInterface, err)
	}
	s.propsMu.Lock()
	s.props = &counterProps{props: props, inbox: inbox, outb: outbox}
	s.propsMu.Unlock()
	s.refreshCounters() // in case a commit landed in between

	reply, err := conn.RequestName(bus.IntakeName, dbus.NameFlagDoNotQueue)
	if err != nil {
		return fmt.Errorf("cannot own %s: %w", bus.IntakeName, err)
	}
	if reply != dbus.RequestNameReplyPrimaryOwner && reply != dbus.RequestNameReplyAlreadyOwner {
		return fmt.Errorf("cannot own %s: another process owns it (is berth-intake already running?)", bus.IntakeName)
	}
	if s.submitter.CompareAndSwap(nil, &submitterBox{BusSubmitter{Conn: conn}}) {
		wake(s.wakeForward)
	}
	return nil
}

// introspectionNode is units.IntakeXML plus the standard interfaces the
// object also answers, so that `busctl introspect` shows all of them.
func introspectionNode() (*introspect.Node, error) {
	var node introspect.Node
	if err := xml.Unmarshal([]byte(units.IntakeXML), &node); err != nil {
		return nil, fmt.Errorf("cannot parse interface XML: %w", err)
	}
	node.Name = string(bus.IntakePath)
	node.Interfaces = append(node.Interfaces, prop.IntrospectData, introspect.IntrospectData, introspect.PeerData)
	return &node, nil
}
