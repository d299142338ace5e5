package scheduler

import (
	"encoding/xml"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/introspect"
	"github.com/godbus/dbus/v5/prop"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/units"
)

// Who may call what: Submit and CancelRun change state (intake runs as user
// berth); GetRun and ListRuns expose message text.
var (
	changeAuthorizer = bus.Authorizer{ExtraUsers: []string{"berth"}}
	readAuthorizer   = bus.Authorizer{}
)

// Export puts dev.berth.Scheduler1 on conn at /dev/berth/Scheduler1 and then
// requests the name. It fails when another process owns the name.
func (s *Service) Export(conn *dbus.Conn) error {
	obj := &schedulerObject{s: s, conn: conn}
	if err := conn.Export(obj, bus.SchedulerPath, bus.SchedulerInterface); err != nil {
		return fmt.Errorf("cannot export %s: %w", bus.SchedulerInterface, err)
	}
	props := &properties{conn: conn}
	if err := conn.Export(props, bus.SchedulerPath, "org.freedesktop.DBus.Properties"); err != nil {
		return fmt.Errorf("cannot export properties: %w", err)
	}
	xmlData, err := introspection()
	if err != nil {
		return err
	}
	if err := conn.Export(introspect.Introspectable(xmlData), bus.SchedulerPath, "org.freedesktop.DBus.Introspectable"); err != nil {
		return fmt.Errorf("cannot export introspection: %w", err)
	}
	// Parents list their child so `busctl tree` finds the object.
	parts := strings.Split(strings.TrimPrefix(string(bus.SchedulerPath), "/"), "/")
	for i := range parts {
		parent := dbus.ObjectPath("/" + strings.Join(parts[:i], "/"))
		node := introspect.NewIntrospectable(&introspect.Node{Children: []introspect.Node{{Name: parts[i]}}})
		if err := conn.Export(node, parent, "org.freedesktop.DBus.Introspectable"); err != nil {
			return fmt.Errorf("cannot export introspection of %s: %w", parent, err)
		}
	}

	s.connMu.Lock()
	s.conn, s.props = conn, props
	s.connMu.Unlock()
	s.publishCounts()

	reply, err := conn.RequestName(bus.SchedulerName, dbus.NameFlagDoNotQueue)
	if err != nil {
		return fmt.Errorf("cannot request name %s: %w", bus.SchedulerName, err)
	}
	if reply != dbus.RequestNameReplyPrimaryOwner {
		return fmt.Errorf("cannot own %s: another process owns it (is berth-scheduler already running?)", bus.SchedulerName)
	}
	return nil
}

// introspection is units.SchedulerXML as installed, plus the standard
// interfaces the object also answers.
func introspection() (string, error) {
	var extra strings.Builder
	for _, iface := range []introspect.Interface{introspect.IntrospectData, prop.IntrospectData, introspect.PeerData} {
		data, err := xml.MarshalIndent(struct {
			XMLName xml.Name `xml:"interface"`
			introspect.Interface
		}{Interface: iface}, "  ", "  ")
		if err != nil {
			return "", fmt.Errorf("cannot build introspection data: %w", err)
		}
		extra.WriteString("  ")
		extra.Write(data)
		extra.WriteString("\n")
	}
	doc := units.SchedulerXML
	end := strings.LastIndex(doc, "</node>")
	if end < 0 {
		return "", errors.New("cannot build introspection data: units.SchedulerXML has no </node>")
	}
	return doc[:end] + extra.String() + doc[end:], nil
}

// schedulerObject is the exported dev.berth.Scheduler1 interface.
type schedulerObject struct {
	s    *Service
	conn *dbus.Conn
}

func (o *schedulerObject) Submit(sender dbus.Sender, msg map[string]string) (string, *dbus.Error) {
	if derr := changeAuthorizer.Check(o.conn, sender); derr != nil {
		return "", derr
	}
	id, err := o.s.Submit(msg)
	if err != nil {
		return "", dbusError(err)
	}
	return id, nil
}

func (o *schedulerObject) GetRun(sender dbus.Sender, id string) (map[string]dbus.Variant, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return nil, derr
	}
	r, err := o.s.GetRun(id)
	if err != nil {
		return nil, dbusError(err)
	}
	return r.Variants(), nil
}

func (o *schedulerObject) ListRuns(sender dbus.Sender, filter map[string]dbus.Variant) ([]map[string]dbus.Variant, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return nil, derr
	}
	var f RunFilter
	for key, v := range filter {
		var err error
		switch key {
		case "state":
			err = dbus.Store([]any{v.Value()}, &f.State)
		case "agent":
			err = dbus.Store([]any{v.Value()}, &f.Agent)
		case "limit":
			var limit uint32
			if err = dbus.Store([]any{v.Value()}, &limit); err == nil {
				f.Limit = int(limit)
			}
		default:
			return nil, bus.NewError(bus.ErrInvalidArgument, "unknown filter key %q (known: state, agent, limit)", key)
		}
		if err != nil {
			return nil, bus.NewError(bus.ErrInvalidArgument, "filter %s has type %s: %v", key, v.Signature(), err)
		}
	}
	runs, err := o.s.ListRuns(f)
	if err != nil {
		return nil, dbusError(err)
	}
	out := make([]map[string]dbus.Variant, 0, len(runs))
	for _, r := range runs {
		out = append(out, r.Variants())
	}
	return out, nil
}

func (o *schedulerObject) CancelRun(sender dbus.Sender, id string) *dbus.Error {
	if derr := changeAuthorizer.Check(o.conn, sender); derr != nil {
		return derr
	}
	if err := o.s.CancelRun(id); err != nil {
		return dbusError(err)
	}
	return nil
}

// ExplainAgent and TestProviders are answered by the run plan code
// (explain.go): what the admin is shown is what the scheduler would run.
func (o *schedulerObject) ExplainAgent(sender dbus.Sender, agent string) (string, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return "", derr
	}
	out, err := o.s.ExplainAgentJSON(agent)
	if err != nil {
		return "", dbusError(err)
	}
	return out, nil
}

func (o *schedulerObject) TestProviders(sender dbus.Sender, name string) ([]map[string]dbus.Variant, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return nil, derr
	}
	out, err := o.s.TestProviders(name)
	if err != nil {
		return nil, dbusError(err)
	}
	return out, nil
}

func dbusError(err error) *dbus.Error {
	switch {
	case errors.Is(err, ErrNotFound):
		return bus.NewError(bus.ErrNotFound, "%v", err)
	case errors.Is(err, ErrInvalidArgument):
		return bus.NewError(bus.ErrInvalidArgument, "%v", err)
	}
	return bus.NewError(bus.ErrInternal, "%v", err)
}

// Variants is the run as dev.berth.Scheduler1 returns it (keys in the
// interface XML).
func (r Run) Variants() map[string]dbus.Variant {
	toolCalls := string(r.ToolCalls)
	if toolCalls == "" {
		toolCalls = "[]"
	}
	usec := func(t interface{ UnixMicro() int64 }, zero bool) dbus.Variant {
		if zero {
			return dbus.MakeVariant(uint64(0))
		}
		return dbus.MakeVariant(uint64(t.UnixMicro()))
	}
	return map[string]dbus.Variant{
		"id":            dbus.MakeVariant(r.ID),
		"message_id":    dbus.MakeVariant(r.MessageID),
		"agent":         dbus.MakeVariant(r.Agent),
		"state":         dbus.MakeVariant(r.State),
		"reason":        dbus.MakeVariant(r.Reason),
		"reply":         dbus.MakeVariant(r.Reply),
		"error":         dbus.MakeVariant(r.Error),
		"connector":     dbus.MakeVariant(r.Connector),
		"channel":       dbus.MakeVariant(r.Channel),
		"thread":        dbus.MakeVariant(r.Thread),
		"author":        dbus.MakeVariant(r.Author),
		"text":          dbus.MakeVariant(r.Text),
		"attempts":      dbus.MakeVariant(uint32(r.Attempts)),
		"created_usec":  usec(r.CreatedAt, r.CreatedAt.IsZero()),
		"started_usec":  usec(r.StartedAt, r.StartedAt.IsZero()),
		"finished_usec": usec(r.FinishedAt, r.FinishedAt.IsZero()),
		"delivered":     dbus.MakeVariant(r.Delivered),
		"backend":       dbus.MakeVariant(r.Backend),
		"tool_calls":    dbus.MakeVariant(toolCalls),
		"stderr_tail":   dbus.MakeVariant(r.StderrTail),
	}
}

// bus returns the connection signals go to, or nil before Export.
func (s *Service) bus() *dbus.Conn {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return s.conn
}

// emitStateChanged and emitFinished are called after the commit that made
// the change, never inside a transaction.
func (s *Service) emitStateChanged(r Run) {
	conn := s.bus()
	if conn == nil {
		return
	}
	if err := conn.Emit(bus.SchedulerPath, bus.SchedulerInterface+".RunStateChanged", r.ID, r.Agent, r.State); err != nil {
		s.log.Debug("cannot emit RunStateChanged", "run", r.ID, "err", err)
	}
}

func (s *Service) emitFinished(r Run) {
	s.emitStateChanged(r)
	conn := s.bus()
	if conn == nil {
		return
	}
	if err := conn.Emit(bus.SchedulerPath, bus.SchedulerInterface+".RunFinished", r.ID, r.Agent, r.State, r.Reason); err != nil {
		s.log.Debug("cannot emit RunFinished", "run", r.ID, "err", err)
	}
}

// counts are the values of the QueueDepth and Running properties.
type counts struct {
	QueueDepth uint32
	Running    uint32
}

// publishCounts recomputes the properties and emits PropertiesChanged for
// those that changed. The lock order is countsMu, then mu.
func (s *Service) publishCounts() {
	s.countsMu.Lock()
	defer s.countsMu.Unlock()
	var c counts
	err := s.store.db.View(func(tx *bolt.Tx) error {
		c.QueueDepth = uint32(queueBucket(tx).Stats().KeyN)
		return nil
	})
	if err != nil {
		return
	}
	s.mu.Lock()
	c.Running = uint32(len(s.active))
	s.mu.Unlock()

	s.connMu.Lock()
	props := s.props
	s.connMu.Unlock()
	if props == nil {
		return
	}
	changed := props.set(c)
	if len(changed) == 0 {
		return
	}
	if err := props.conn.Emit(bus.SchedulerPath, "org.freedesktop.DBus.Properties.PropertiesChanged",
		bus.SchedulerInterface, changed, []string{}); err != nil {
		s.log.Debug("cannot emit PropertiesChanged", "err", err)
	}
}

// properties is org.freedesktop.DBus.Properties of the scheduler object:
// two read-only counters.
type properties struct {
	conn *dbus.Conn
	mu   sync.Mutex
	c    counts
}

// set stores c and returns the properties that changed.
func (p *properties) set(c counts) map[string]dbus.Variant {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := map[string]dbus.Variant{}
	if c.QueueDepth != p.c.QueueDepth {
		changed["QueueDepth"] = dbus.MakeVariant(c.QueueDepth)
	}
	if c.Running != p.c.Running {
		changed["Running"] = dbus.MakeVariant(c.Running)
	}
	p.c = c
	return changed
}

func (p *properties) all() map[string]dbus.Variant {
	p.mu.Lock()
	defer p.mu.Unlock()
	return map[string]dbus.Variant{
		"QueueDepth": dbus.MakeVariant(p.c.QueueDepth),
		"Running":    dbus.MakeVariant(p.c.Running),
	}
}

func (p *properties) Get(iface, name string) (dbus.Variant, *dbus.Error) {
	if iface != bus.SchedulerInterface {
		return dbus.Variant{}, prop.ErrIfaceNotFound
	}
	v, ok := p.all()[name]
	if !ok {
		return dbus.Variant{}, prop.ErrPropNotFound
	}
	return v, nil
}

func (p *properties) GetAll(iface string) (map[string]dbus.Variant, *dbus.Error) {
	if iface != bus.SchedulerInterface {
		return nil, prop.ErrIfaceNotFound
	}
	return p.all(), nil
}

func (p *properties) Set(iface, name string, _ dbus.Variant) *dbus.Error {
	return prop.ErrReadOnly
}
