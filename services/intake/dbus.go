package intake

import (
	"encoding/xml"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/introspect"
	"github.com/godbus/dbus/v5/prop"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/metrics"
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
	return o.deliverError(o.service.Deliver(busapi.ReplyFromWire(reply)))
}

// DeliverFiles implements dev.berth.Intake1.DeliverFiles: Deliver for a
// reply with files, each copied into intake's state before it returns.
func (o *intakeObject) DeliverFiles(sender dbus.Sender, reply map[string]string, wire []busapi.FileWire) *dbus.Error {
	files, err := busapi.FilesFromWire(wire)
	if err != nil {
		return bus.NewError(bus.ErrInvalidArgument, "%v", err)
	}
	defer busapi.CloseFiles(files)
	if derr := o.auth.Check(o.conn, sender); derr != nil {
		o.service.log.Warn("DeliverFiles refused", "sender", string(sender), "err", derr)
		return derr
	}
	r := busapi.ReplyFromWire(reply)
	r.Files = files
	return o.deliverError(o.service.Deliver(r))
}

// deliverError is Deliver's answer for what storing the reply returned.
func (o *intakeObject) deliverError(err error) *dbus.Error {
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

// propertySetter publishes the properties of dev.berth.Intake1.
type propertySetter interface {
	setCounts(inbox, outbox uint32)
	setConnectors([]ConnectorStatus)
}

// properties is org.freedesktop.DBus.Properties of /dev/berth/Intake1: every
// property is read-only, and a change emits PropertiesChanged with the new
// value (the XML's default). Values are replaced, never changed in place, so
// a reply being encoded never sees a value being written. (godbus's prop
// package stores new values into the old ones' maps, which races with the
// encoding of a Get reply for aa{sv}.) Only publish calls set, so changes
// are emitted in order and never under a lock.
type properties struct {
	conn   *dbus.Conn
	mu     sync.Mutex
	values map[string]dbus.Variant
}

const propertiesInterface = "org.freedesktop.DBus.Properties"

func (p *properties) Get(iface, name string) (dbus.Variant, *dbus.Error) {
	if iface != bus.IntakeInterface {
		return dbus.Variant{}, prop.ErrIfaceNotFound
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.values[name]
	if !ok {
		return dbus.Variant{}, prop.ErrPropNotFound
	}
	return v, nil
}

func (p *properties) GetAll(iface string) (map[string]dbus.Variant, *dbus.Error) {
	if iface != bus.IntakeInterface {
		return nil, prop.ErrIfaceNotFound
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.values), nil
}

func (p *properties) Set(iface, name string, _ dbus.Variant) *dbus.Error {
	if _, err := p.Get(iface, name); err != nil {
		return err
	}
	return prop.ErrReadOnly
}

// set replaces a property's value and, when it changed, emits
// PropertiesChanged.
func (p *properties) set(name string, v dbus.Variant) {
	p.mu.Lock()
	old, ok := p.values[name]
	p.values[name] = v
	p.mu.Unlock()
	if ok && reflect.DeepEqual(old.Value(), v.Value()) {
		return
	}
	_ = p.conn.Emit(bus.IntakePath, propertiesInterface+".PropertiesChanged", bus.IntakeInterface, map[string]dbus.Variant{name: v}, []string{})
}

func (p *properties) setCounts(inbox, outbox uint32) {
	p.set("InboxPending", dbus.MakeVariant(inbox))
	p.set("OutboxPending", dbus.MakeVariant(outbox))
}

func (p *properties) setConnectors(st []ConnectorStatus) {
	p.set("Connectors", dbus.MakeVariant(connectorsValue(st)))
}

// connectorsValue is the Connectors property (aa{sv}; the XML lists the keys).
func connectorsValue(st []ConnectorStatus) []map[string]dbus.Variant {
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339)
	}
	out := make([]map[string]dbus.Variant, 0, len(st))
	for _, c := range st {
		out = append(out, busapi.ConnectorStatus{
			ID:             bus.Text(c.ID),
			Type:           bus.Text(c.Type),
			State:          bus.Text(c.State),
			ConnectedSince: stamp(c.ConnectedSince),
			LastEvent:      stamp(c.LastEvent),
			LastError:      bus.Text(c.LastError),
			LastErrorAt:    stamp(c.LastErrorAt),
			Reconnects:     uint32(max(c.Reconnects, 0)),
			Warning:        bus.Text(c.Warning),
			Progress:       c.Progress,
			Reactions:      bus.Text(c.Reactions),
		}.Wire())
	}
	return out
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
	inbox, outbox := s.store.pendingCounts()
	props := &properties{conn: conn, values: map[string]dbus.Variant{
		"InboxPending":  dbus.MakeVariant(inbox),
		"OutboxPending": dbus.MakeVariant(outbox),
		"Connectors":    dbus.MakeVariant(connectorsValue(s.ConnectorStatuses())),
	}}
	if err := conn.Export(props, bus.IntakePath, propertiesInterface); err != nil {
		return fmt.Errorf("cannot export properties of %s: %w", bus.IntakeInterface, err)
	}
	if err := metrics.Export(conn, bus.IntakePath, s.metrics.reg); err != nil {
		return err
	}
	if err := conn.Export(node, bus.IntakePath, "org.freedesktop.DBus.Introspectable"); err != nil {
		return fmt.Errorf("cannot export introspection of %s: %w", bus.IntakeInterface, err)
	}
	s.propsMu.Lock()
	s.props = props
	s.propsMu.Unlock()
	go s.publish(conn.Context().Done())
	s.refreshCounters() // in case a commit landed in between
	s.watchRunProgress(conn)

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
// object also answers, each once, so that `busctl introspect` shows all of
// them. (introspect.NewIntrospectable is not used: it adds Peer a second time
// when Introspectable is already listed.)
func introspectionNode() (introspect.Introspectable, error) {
	var node introspect.Node
	if err := xml.Unmarshal([]byte(units.IntakeXML), &node); err != nil {
		return "", fmt.Errorf("cannot parse interface XML: %w", err)
	}
	node.Name = string(bus.IntakePath)
	for _, std := range []introspect.Interface{metrics.IntrospectData(), prop.IntrospectData, introspect.IntrospectData, introspect.PeerData} {
		if !slices.ContainsFunc(node.Interfaces, func(i introspect.Interface) bool { return i.Name == std.Name }) {
			node.Interfaces = append(node.Interfaces, std)
		}
	}
	b, err := xml.Marshal(&node)
	if err != nil {
		return "", fmt.Errorf("cannot encode interface XML: %w", err)
	}
	return introspect.Introspectable(strings.TrimSpace(introspect.IntrospectDeclarationString) + string(b)), nil
}
