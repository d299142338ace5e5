package scheduler

import (
	"encoding/xml"
	"errors"
	"fmt"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/introspect"
	"github.com/godbus/dbus/v5/prop"
	bolt "go.etcd.io/bbolt"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/metrics"
	"github.com/berth-dev/berth/units"
)

// Who may call what: Submit and CancelRun change state (intake runs as user
// berth); GetRun and ListRuns expose message text.
var (
	changeAuthorizer = bus.Authorizer{ExtraUsers: []string{"berth"}}
	readAuthorizer   = bus.Authorizer{}
	// adminAuthorizer: root, berth-admin and the scheduler's own user.
	adminAuthorizer = bus.Authorizer{}
)

// Export puts dev.berth.Scheduler1 on conn at /dev/berth/Scheduler1 and then
// requests the name. It fails when another process owns the name. The
// introspection data and the properties come from units.SchedulerXML, the
// interface as installed.
func (s *Service) Export(conn *dbus.Conn) error {
	node, err := introspectionNode()
	if err != nil {
		return fmt.Errorf("cannot export %s: %w", bus.SchedulerInterface, err)
	}
	obj := &schedulerObject{s: s, conn: conn}
	if err := conn.Export(obj, bus.SchedulerPath, bus.SchedulerInterface); err != nil {
		return fmt.Errorf("cannot export %s: %w", bus.SchedulerInterface, err)
	}
	pm, err := propertyMap(node)
	if err != nil {
		return fmt.Errorf("cannot export properties of %s: %w", bus.SchedulerInterface, err)
	}
	exported, err := prop.Export(conn, bus.SchedulerPath, pm)
	if err != nil {
		return fmt.Errorf("cannot export properties of %s: %w", bus.SchedulerInterface, err)
	}
	// Not introspect.NewIntrospectable: it appends a second
	// org.freedesktop.DBus.Peer when Introspectable comes first in the node
	// (godbus v5.2.4), which busctl rejects as a duplicate method.
	data, err := xml.MarshalIndent(node, "", "  ")
	if err != nil {
		return fmt.Errorf("cannot encode introspection data: %w", err)
	}
	if err := metrics.Export(conn, bus.SchedulerPath, s.metrics.reg); err != nil {
		return err
	}
	xmlData := introspect.Introspectable(strings.TrimSpace(introspect.IntrospectDeclarationString) + "\n" + string(data))
	if err := conn.Export(xmlData, bus.SchedulerPath, "org.freedesktop.DBus.Introspectable"); err != nil {
		return fmt.Errorf("cannot export introspection of %s: %w", bus.SchedulerInterface, err)
	}
	// Parents list their child so `busctl tree` finds the object.
	parts := strings.Split(strings.TrimPrefix(string(bus.SchedulerPath), "/"), "/")
	for i := range parts {
		parent := dbus.ObjectPath("/" + strings.Join(parts[:i], "/"))
		child := introspect.NewIntrospectable(&introspect.Node{Children: []introspect.Node{{Name: parts[i]}}})
		if err := conn.Export(child, parent, "org.freedesktop.DBus.Introspectable"); err != nil {
			return fmt.Errorf("cannot export introspection of %s: %w", parent, err)
		}
	}

	s.connMu.Lock()
	s.conn, s.props = conn, &properties{conn: conn, p: exported}
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

// introspectionNode is units.SchedulerXML plus the standard interfaces the
// object also answers (each once: the XML may list some itself).
func introspectionNode() (*introspect.Node, error) {
	var node introspect.Node
	if err := xml.Unmarshal([]byte(units.SchedulerXML), &node); err != nil {
		return nil, fmt.Errorf("cannot parse interface XML: %w", err)
	}
	node.Name = string(bus.SchedulerPath)
	for _, std := range []introspect.Interface{metrics.IntrospectData(), prop.IntrospectData, introspect.IntrospectData, introspect.PeerData} {
		if !slices.ContainsFunc(node.Interfaces, func(i introspect.Interface) bool { return i.Name == std.Name }) {
			node.Interfaces = append(node.Interfaces, std)
		}
	}
	return &node, nil
}

// propertyMap declares the properties of the scheduler interface as the
// XML lists them. They are read-only and start at zero; publishCounts sets
// them and emits PropertiesChanged itself, outside any lock.
func propertyMap(node *introspect.Node) (prop.Map, error) {
	props := map[string]*prop.Prop{}
	for _, iface := range node.Interfaces {
		if iface.Name != bus.SchedulerInterface {
			continue
		}
		for _, p := range iface.Properties {
			if p.Type != "u" {
				return nil, fmt.Errorf("property %s has type %s; only u is published", p.Name, p.Type)
			}
			props[p.Name] = &prop.Prop{Value: uint32(0), Emit: prop.EmitFalse}
		}
	}
	for _, name := range []string{"QueueDepth", "Running", "Quarantined"} {
		if props[name] == nil {
			return nil, fmt.Errorf("the interface XML has no property %s", name)
		}
	}
	return prop.Map{bus.SchedulerInterface: props}, nil
}

// schedulerObject is the exported dev.berth.Scheduler1 interface.
type schedulerObject struct {
	s          *Service
	conn       *dbus.Conn
	submitters allowedSenders
}

// allowedSenders remembers, for allowedFor, the bus connections the
// change authorizer let submit. A unique bus name is never given to another
// connection and its uid is fixed when it connects, so intake's stream of
// Submits costs one GetConnectionUnixUser round trip a minute instead of
// one per message; the minute bounds how long a user taken out of
// berth-admin keeps a connection's right. Refusals are not remembered.
type allowedSenders struct {
	mu    sync.Mutex
	until map[dbus.Sender]time.Time
}

const (
	allowedFor     = time.Minute
	maxAllowedSeen = 1024 // connections remembered at once
)

// check is changeAuthorizer.Check, answered from memory for a connection
// allowed less than allowedFor ago.
func (a *allowedSenders) check(conn *dbus.Conn, sender dbus.Sender, now time.Time) *dbus.Error {
	a.mu.Lock()
	until, ok := a.until[sender]
	a.mu.Unlock()
	if ok && now.Before(until) {
		return nil
	}
	if derr := changeAuthorizer.Check(conn, sender); derr != nil {
		return derr
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.until == nil || len(a.until) >= maxAllowedSeen {
		fresh := make(map[dbus.Sender]time.Time, len(a.until))
		for s, t := range a.until {
			if now.Before(t) && len(fresh) < maxAllowedSeen/2 {
				fresh[s] = t
			}
		}
		a.until = fresh
	}
	a.until[sender] = now.Add(allowedFor)
	return nil
}

func (o *schedulerObject) Submit(sender dbus.Sender, msg map[string]string) (string, *dbus.Error) {
	if derr := o.submitters.check(o.conn, sender, o.s.clock.Now()); derr != nil {
		return "", derr
	}
	id, err := o.s.Submit(busapi.SubmissionFromWire(msg))
	if err != nil {
		return "", dbusError(err)
	}
	return id, nil
}

// SubmitFiles is Submit for a message with files (a(sssxh): name, type,
// caption, size, descriptor): the scheduler has its own copy of every file
// once it returns. The descriptors are closed here, taken or not.
func (o *schedulerObject) SubmitFiles(sender dbus.Sender, msg map[string]string, wire []busapi.FileWire) (string, *dbus.Error) {
	files, err := busapi.FilesFromWire(wire)
	if err != nil {
		return "", bus.NewError(bus.ErrInvalidArgument, "%v", err)
	}
	defer busapi.CloseFiles(files)
	if derr := o.submitters.check(o.conn, sender, o.s.clock.Now()); derr != nil {
		return "", derr
	}
	sub := busapi.SubmissionFromWire(msg)
	sub.Files = files
	id, err := o.s.SubmitFiles(sub)
	if err != nil {
		return "", dbusError(err)
	}
	return id, nil
}

// ListApprovals and DecideApproval (approvals.go): who may read runs may
// list them; only an admin (root, berth-admin) decides, never intake.
func (o *schedulerObject) ListApprovals(sender dbus.Sender, state string) ([]map[string]dbus.Variant, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return nil, derr
	}
	list, err := o.s.ListApprovals(state)
	if err != nil {
		return nil, dbusError(err)
	}
	out := make([]map[string]dbus.Variant, len(list))
	for i, a := range list {
		out[i] = a.Wire()
	}
	return out, nil
}

func (o *schedulerObject) DecideApproval(sender dbus.Sender, id, decision string) (map[string]dbus.Variant, *dbus.Error) {
	if derr := adminAuthorizer.Check(o.conn, sender); derr != nil {
		return nil, derr
	}
	d, err := parseDecision(decision)
	if err != nil {
		return nil, dbusError(err)
	}
	by := "berthctl"
	if c, err := bus.CallerOf(o.conn, sender); err == nil {
		by = "berthctl:" + userName(c.UID)
	}
	ap, err := o.s.decide(id, d, by)
	if err != nil {
		return nil, dbusError(err)
	}
	return ap.Wire(), nil
}

// DecideApprovalFor is a person's decision in the chat, as intake read it
// from the platform: only intake may say who clicked, and the scheduler
// decides only for the agent's [[approvers]].
func (o *schedulerObject) DecideApprovalFor(sender dbus.Sender, id, decision, approver string, groups []string) (map[string]dbus.Variant, *dbus.Error) {
	if derr := o.submitters.check(o.conn, sender, o.s.clock.Now()); derr != nil {
		return nil, derr
	}
	d, err := parseDecision(decision)
	if err != nil {
		return nil, dbusError(err)
	}
	ap, err := o.s.DecideApprovalFor(id, d, approver, groups...)
	if err != nil {
		return nil, dbusError(err)
	}
	return ap.Wire(), nil
}

func (o *schedulerObject) GetRun(sender dbus.Sender, id string) (map[string]dbus.Variant, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return nil, derr
	}
	r, err := o.s.GetRun(id)
	if err != nil {
		return nil, dbusError(err)
	}
	return r.Wire(), nil
}

func (o *schedulerObject) ListRuns(sender dbus.Sender, filter map[string]dbus.Variant) ([]map[string]dbus.Variant, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return nil, derr
	}
	lf, err := busapi.ListFilterFromWire(filter)
	if err != nil {
		return nil, bus.NewError(bus.ErrInvalidArgument, "%v", err)
	}
	f := RunFilter{State: lf.State, Agent: lf.Agent, Schedule: lf.Schedule, Before: lf.Before, Limit: int(min(lf.Limit, maxListLimit+1))}
	runs, err := o.s.ListRuns(f)
	if err != nil {
		return nil, dbusError(err)
	}
	out := make([]map[string]dbus.Variant, 0, len(runs))
	for _, r := range runs {
		out = append(out, r.Wire())
	}
	return out, nil
}

func (o *schedulerObject) GetRunOutput(sender dbus.Sender, id, what string, offset uint64) (string, uint64, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return "", 0, derr
	}
	chunk, next, err := o.s.RunOutput(id, what, offset)
	if err != nil {
		return "", 0, dbusError(err)
	}
	return chunk, next, nil
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
	e, err := o.s.ExplainAgent(agent)
	if err != nil {
		return "", dbusError(err)
	}
	return e.Wire(), nil
}

// ProbeMCP is berthctl sandbox explain --probe: the agent's MCP servers
// as a real run finds them, a JSON array like GetRun's mcp.
func (o *schedulerObject) ProbeMCP(sender dbus.Sender, agent string) (string, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return "", derr
	}
	servers, err := o.s.ProbeMCP(agent)
	if err != nil {
		return "", dbusError(err)
	}
	return mcpJSON(Run{MCP: servers}), nil
}

func (o *schedulerObject) TestProviders(sender dbus.Sender, name string) ([]map[string]dbus.Variant, *dbus.Error) {
	if derr := readAuthorizer.Check(o.conn, sender); derr != nil {
		return nil, derr
	}
	results, err := o.s.TestProviders(name)
	if err != nil {
		return nil, dbusError(err)
	}
	out := make([]map[string]dbus.Variant, len(results))
	for i, r := range results {
		out[i] = r.Wire()
	}
	return out, nil
}

func dbusError(err error) *dbus.Error {
	switch {
	case errors.Is(err, ErrNotFound):
		return bus.NewError(bus.ErrNotFound, "%v", err)
	case errors.Is(err, ErrInvalidArgument):
		return bus.NewError(bus.ErrInvalidArgument, "%v", err)
	case errors.Is(err, ErrNotApprover):
		return bus.NewError(bus.ErrAccessDenied, "%v", err)
	}
	// A full state disk is Internal too: intake retries it, and the
	// message says why.
	return bus.NewError(bus.ErrInternal, "%v", err)
}

// maxFieldBytes bounds each long text GetRun returns and each page of
// GetRunOutput, so that no reply comes near the bus's message size limit.
const maxFieldBytes = 1 << 20

// Wire is the run as dev.berth.Scheduler1.GetRun returns it.
func (r Run) Wire() map[string]dbus.Variant { return r.BusRun().Wire() }

// BusRun is the run as GetRun gives it. Each long text is at most
// maxFieldBytes, with its whole size and whether it was cut (GetRunOutput
// reads the rest). A cut tool_calls is "[]" rather than broken JSON.
func (r Run) BusRun() busapi.Run {
	toolCalls := string(r.ToolCalls)
	if toolCalls == "" {
		toolCalls = "[]"
	}
	output := func(full string, isJSON bool) busapi.Output {
		text := cleanText(full)
		cut := len(text) > maxFieldBytes
		switch {
		case cut && isJSON:
			text = "[]"
		case cut:
			text = cutUTF8(text, maxFieldBytes)
		}
		return busapi.Output{Text: text, Bytes: uint32(len(full)), Cut: cut}
	}
	return busapi.Run{
		RunHead: busapi.RunHead{
			ID:         r.ID,
			MessageID:  r.MessageID,
			Agent:      r.Agent,
			State:      r.State,
			Reason:     r.Reason,
			Connector:  r.Connector,
			Channel:    r.Channel,
			Thread:     r.Thread,
			Author:     r.Author,
			Attempts:   uint32(r.Attempts),
			CreatedAt:  r.CreatedAt,
			StartedAt:  r.StartedAt,
			FinishedAt: r.FinishedAt,
			Delivered:  r.Delivered,
			Backend:    r.Backend,
			Schedule:   r.Schedule,
		},
		EgressDropped:     uint32(r.EgressDropped),
		Text:              output(r.Text, false),
		Reply:             output(r.Reply, false),
		Error:             output(r.Error, false),
		ToolCalls:         output(toolCalls, true),
		StderrTail:        output(r.StderrTail, false),
		Egress:            output(egressJSON(r), false),
		EgressCounts:      output(egressCountsJSON(r), false),
		MCP:               output(mcpJSON(r), true),
		Usage:             output(runUsageJSON(r), false),
		Sandbox:           r.Sandbox,
		SandboxNote:       r.SandboxNote,
		Model:             r.Model,
		MaxRuntimeSeconds: r.MaxRuntimeSeconds,
		TraceID:           r.TraceID,
	}
}

// Wire is the summary as dev.berth.Scheduler1.ListRuns returns it.
func (sum Summary) Wire() map[string]dbus.Variant {
	return busapi.RunSummary{
		RunHead: busapi.RunHead{
			ID:         sum.ID,
			MessageID:  cleanText(sum.MessageID),
			Agent:      sum.Agent,
			State:      sum.State,
			Reason:     cleanText(sum.Reason),
			Connector:  cleanText(sum.Connector),
			Channel:    cleanText(sum.Channel),
			Thread:     cleanText(sum.Thread),
			Author:     cleanText(sum.Author),
			Attempts:   uint32(sum.Attempts),
			Backend:    sum.Backend,
			CreatedAt:  sum.CreatedAt,
			StartedAt:  sum.StartedAt,
			FinishedAt: sum.FinishedAt,
			Delivered:  sum.Delivered,
			Schedule:   sum.Schedule,
		},
		TextPreview:  cleanText(sum.TextPreview),
		ReplyPreview: cleanText(sum.ReplyPreview),
		TextBytes:    uint32(sum.TextBytes),
		ReplyBytes:   uint32(sum.ReplyBytes),
	}.Wire()
}

// RunOutput is a page of one of a run's long texts (GetRunOutput): at most
// maxFieldBytes from offset, ending on a character boundary, and the offset
// of the next page (0 after the last).
func (s *Service) RunOutput(id, what string, offset uint64) (string, uint64, error) {
	r, err := s.GetRun(id)
	if err != nil {
		return "", 0, err
	}
	var text string
	switch what {
	case "text":
		text = r.Text
	case "reply":
		text = r.Reply
	case "error":
		text = r.Error
	case "stderr":
		text = r.StderrTail
	case "tool_calls":
		text = string(r.ToolCalls)
	default:
		return "", 0, fmt.Errorf("%w: unknown output %q (known: text, reply, error, stderr, tool_calls)", ErrInvalidArgument, what)
	}
	text = cleanText(text)
	if offset > uint64(len(text)) {
		return "", 0, fmt.Errorf("%w: offset %d is past the end (%d bytes)", ErrInvalidArgument, offset, len(text))
	}
	if offset < uint64(len(text)) && !utf8.RuneStart(text[offset]) {
		return "", 0, fmt.Errorf("%w: offset %d is inside a character", ErrInvalidArgument, offset)
	}
	chunk := cutUTF8(text[offset:], maxFieldBytes)
	next := offset + uint64(len(chunk))
	if next >= uint64(len(text)) {
		next = 0
	}
	return chunk, next, nil
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
		s.log.Debug("cannot emit RunStateChanged", "run_id", r.ID, "err", err)
	}
}

func (s *Service) emitFinished(r Run) {
	s.scheduled.runEnded(r.ID)
	s.emitStateChanged(r)
	conn := s.bus()
	if conn == nil {
		return
	}
	if err := conn.Emit(bus.SchedulerPath, bus.SchedulerInterface+".RunFinished", r.ID, r.Agent, r.State, r.Reason); err != nil {
		s.log.Debug("cannot emit RunFinished", "run_id", r.ID, "err", err)
	}
}

// counts are the values of the QueueDepth, Running and Quarantined
// properties.
type counts struct {
	QueueDepth  uint32
	Running     uint32
	Quarantined uint32
}

// publishCounts recomputes the properties and emits PropertiesChanged for
// those that changed. It holds no lock across the store or the bus; when two
// calls race, the one that started last wins.
func (s *Service) publishCounts() {
	gen := s.countsGen.Add(1)
	var c counts
	err := s.store.db.View(func(tx *bolt.Tx) error {
		c.QueueDepth = uint32(queueBucket(tx).Stats().KeyN)
		c.Quarantined = uint32(quarantineCount(tx))
		return nil
	})
	if err != nil {
		s.log.Warn("cannot count queued and quarantined runs", "err", err)
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
	changed := props.set(gen, c)
	if len(changed) == 0 {
		return
	}
	if err := props.conn.Emit(bus.SchedulerPath, "org.freedesktop.DBus.Properties.PropertiesChanged",
		bus.SchedulerInterface, changed, []string{}); err != nil {
		s.log.Debug("cannot emit PropertiesChanged", "err", err)
	}
}

// properties holds the exported properties and the counts last published.
type properties struct {
	conn *dbus.Conn
	p    *prop.Properties
	mu   sync.Mutex
	gen  uint64
	c    counts
}

// set stores c unless a later call (gen) already did, and returns the
// properties that changed.
func (p *properties) set(gen uint64, c counts) map[string]dbus.Variant {
	p.mu.Lock()
	defer p.mu.Unlock()
	if gen < p.gen {
		return nil
	}
	p.gen = gen
	changed := map[string]dbus.Variant{}
	for _, v := range []struct {
		name     string
		old, new uint32
	}{{"QueueDepth", p.c.QueueDepth, c.QueueDepth}, {"Running", p.c.Running, c.Running}, {"Quarantined", p.c.Quarantined, c.Quarantined}} {
		if v.old != v.new {
			p.p.SetMust(bus.SchedulerInterface, v.name, v.new)
			changed[v.name] = dbus.MakeVariant(v.new)
		}
	}
	p.c = c
	return changed
}

// egressJSON is the run's egress decisions as GetRun returns them. A
// decision converts as it is, so a field added to it fails to compile here
// until the bus carries it too.
func egressJSON(r Run) string {
	decisions := make([]busapi.EgressDecision, len(r.Egress))
	for i, d := range r.Egress {
		decisions[i] = busapi.EgressDecision(d)
	}
	return busapi.EgressWire(decisions)
}

// egressCountsJSON is every egress decision of the run counted, as GetRun
// returns it.
func egressCountsJSON(r Run) string {
	c := r.EgressCounts
	if c == nil {
		return (*busapi.EgressCounts)(nil).Wire()
	}
	counts := busapi.EgressCounts{Allowed: c.Allowed, Refused: c.Refused, OtherHosts: busapi.EgressHostCount(c.OtherHosts),
		BytesUp: c.BytesUp, BytesDown: c.BytesDown}
	for _, h := range c.Hosts {
		counts.Hosts = append(counts.Hosts, busapi.EgressHostCount(h))
	}
	return counts.Wire()
}

// userName is uid's user name, or the uid where it has none.
func userName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil {
		return u.Username
	}
	return "uid " + id
}
