package images

import (
	"cmp"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/introspect"
	"github.com/godbus/dbus/v5/prop"

	"github.com/berth-dev/berth/internal/bus"
	"github.com/berth-dev/berth/internal/busapi"
	"github.com/berth-dev/berth/internal/metrics"
	"github.com/berth-dev/berth/units"
)

// imagesObject is dev.berth.Images1 at /dev/berth/Images1.
type imagesObject struct {
	s    *Service
	conn *dbus.Conn
}

// properties are the exported Building and ImageCount.
type properties struct {
	p                  *prop.Properties
	building, imageCnt uint32
}

// callCtx bounds a method call that may wait for a build.
func (o *imagesObject) callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), o.s.timeout)
}

func (o *imagesObject) begin() func() {
	o.s.inFlight.Add(1)
	return func() { o.s.inFlight.Add(-1) }
}

func (o *imagesObject) allowed(sender dbus.Sender, method string) *dbus.Error {
	if derr := o.s.auth.Check(o.conn, sender); derr != nil {
		o.s.log.Warn(method+" refused", "sender", string(sender), "err", derr)
		return derr
	}
	return nil
}

// EnsureIsolationImage implements dev.berth.Images1.EnsureIsolationImage.
func (o *imagesObject) EnsureIsolationImage(sender dbus.Sender, agent string) (string, *dbus.Error) {
	return o.ensure(sender, "EnsureIsolationImage", agent, nil)
}

// EnsureIsolationImageWith implements
// dev.berth.Images1.EnsureIsolationImageWith.
func (o *imagesObject) EnsureIsolationImageWith(sender dbus.Sender, agent string, options map[string]dbus.Variant) (string, *dbus.Error) {
	return o.ensure(sender, "EnsureIsolationImageWith", agent, options)
}

// ensure answers both: the call's span is a child of the caller's when it
// sent its traceparent.
func (o *imagesObject) ensure(sender dbus.Sender, method, agent string, options map[string]dbus.Variant) (string, *dbus.Error) {
	defer o.begin()()
	if derr := o.allowed(sender, method); derr != nil {
		return "", derr
	}
	opts, err := busapi.EnsureOptionsFromWire(options)
	if err != nil {
		return "", bus.NewError(bus.ErrInvalidArgument, "%v", err)
	}
	ctx, cancel := o.callCtx()
	defer cancel()
	tag, err := o.s.EnsureIsolationImageWith(ctx, agent, opts)
	if err != nil {
		return "", o.s.busError(err, "agent", agent)
	}
	return tag, nil
}

// Build implements dev.berth.Images1.Build.
func (o *imagesObject) Build(sender dbus.Sender, opts map[string]dbus.Variant) (dbus.ObjectPath, *dbus.Error) {
	defer o.begin()()
	if derr := o.allowed(sender, "Build"); derr != nil {
		return "", derr
	}
	bt, err := busapi.BuildTargetFromWire(opts)
	if err != nil {
		return "", bus.NewError(bus.ErrInvalidArgument, "%v", err)
	}
	target, noCache := cmp.Or(bt.Target, DefaultTarget), bt.NoCache
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	j, err := o.s.StartJob(callerTrace(ctx, bt.Traceparent), target, noCache, func(j *Job) {
		if err := o.exportJob(j); err != nil {
			o.s.log.Error(err.Error())
		}
	})
	if err != nil {
		return "", o.s.busError(err, "target", target)
	}
	o.s.log.Info("build job started", "job", string(j.Path()), "agent", target, "no_cache", noCache)
	return j.Path(), nil
}

// ListImages implements dev.berth.Images1.ListImages.
func (o *imagesObject) ListImages() ([]map[string]dbus.Variant, *dbus.Error) {
	defer o.begin()()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	imgs, err := o.s.ListImages(ctx)
	if err != nil {
		return nil, o.s.busError(err)
	}
	out := make([]map[string]dbus.Variant, 0, len(imgs))
	for _, img := range imgs {
		out = append(out, imageValue(img).Wire())
	}
	return out, nil
}

func imageValue(img Image) busapi.Image {
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339)
	}
	inputs := map[string]string{}
	for k, v := range img.Inputs {
		inputs[k] = boundedText(v)
	}
	tail := make([]string, 0, len(img.LogTail))
	for _, l := range img.LogTail {
		tail = append(tail, boundedText(l))
	}
	agents := img.Agents
	if agents == nil {
		agents = []string{}
	}
	size := img.Size
	if !img.Present {
		size = 0
	}
	return busapi.Image{
		Tag:      img.Tag,
		Kind:     img.Kind,
		Hash:     img.Hash,
		Inputs:   inputs,
		Status:   img.Status,
		Present:  img.Present,
		Size:     size,
		Created:  stamp(img.Created),
		LastUsed: stamp(img.LastUsed),
		Agents:   agents,
		Error:    boundedText(img.Error),
		LogTail:  tail,
	}
}

// Dockerfile implements dev.berth.Images1.Dockerfile.
func (o *imagesObject) Dockerfile(target string) (string, *dbus.Error) {
	defer o.begin()()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	df, err := o.s.Dockerfile(ctx, target)
	if err != nil {
		return "", o.s.busError(err, "target", target)
	}
	return boundedText(df), nil
}

// Remove implements dev.berth.Images1.Remove.
func (o *imagesObject) Remove(sender dbus.Sender, tag string) *dbus.Error {
	defer o.begin()()
	if derr := o.allowed(sender, "Remove"); derr != nil {
		return derr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := o.s.Remove(ctx, tag); err != nil {
		return o.s.busError(err, "image", tag)
	}
	return nil
}

// Clean implements dev.berth.Images1.Clean.
func (o *imagesObject) Clean(sender dbus.Sender, all bool) ([]string, *dbus.Error) {
	defer o.begin()()
	if derr := o.allowed(sender, "Clean"); derr != nil {
		return nil, derr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	removed, err := o.s.Clean(ctx, all)
	if removed == nil {
		removed = []string{}
	}
	if err != nil {
		return nil, o.s.busError(err)
	}
	return removed, nil
}

// busError maps a service error to its dev.berth.Error name.
func (s *Service) busError(err error, attrs ...any) *dbus.Error {
	name := bus.ErrInternal
	switch {
	case errors.Is(err, ErrNotFound):
		name = bus.ErrNotFound
	case errors.Is(err, ErrInvalidArgument), errors.Is(err, ErrInUse):
		name = bus.ErrInvalidArgument
	case errors.Is(err, ErrUnavailable):
		name = bus.ErrUnavailable
	default:
		s.log.Error(err.Error(), attrs...)
	}
	return bus.NewError(name, "%s", boundedText(err.Error()))
}

// jobObject is one job at /dev/berth/Images1/job/<n>.
type jobObject struct {
	j    *Job
	o    *imagesObject
	path dbus.ObjectPath
}

// Cancel implements dev.berth.Images1.Job.Cancel.
func (jo *jobObject) Cancel(sender dbus.Sender) *dbus.Error {
	if derr := jo.o.allowed(sender, "Cancel"); derr != nil {
		return derr
	}
	jo.j.Cancel()
	return nil
}

// exportJob puts the job object on the bus and forwards its progress as
// Progress and Finished signals and property changes.
func (o *imagesObject) exportJob(j *Job) error {
	path := j.Path()
	jo := &jobObject{j: j, o: o, path: path}
	if err := o.conn.Export(jo, path, bus.ImagesJobInterface); err != nil {
		return fmt.Errorf("cannot export job %s: %w", path, err)
	}
	rec := j.Record()
	props, err := prop.Export(o.conn, path, prop.Map{bus.ImagesJobInterface: {
		"State":  {Value: rec.State, Emit: prop.EmitFalse},
		"Target": {Value: rec.Target, Emit: prop.EmitConst},
		"Step":   {Value: rec.Step, Emit: prop.EmitFalse},
		"Total":  {Value: rec.Total, Emit: prop.EmitFalse},
		"Tag":    {Value: rec.Tag, Emit: prop.EmitFalse},
		"Error":  {Value: rec.Error, Emit: prop.EmitFalse},
	}})
	if err != nil {
		return fmt.Errorf("cannot export properties of job %s: %w", path, err)
	}
	node, err := jobIntrospection(path)
	if err != nil {
		return err
	}
	if err := o.conn.Export(node, path, "org.freedesktop.DBus.Introspectable"); err != nil {
		return fmt.Errorf("cannot export introspection of job %s: %w", path, err)
	}
	var last JobRecord
	j.watch(func(r JobRecord, line string) {
		if r.Step != last.Step {
			setProperty(o.conn, props, path, bus.ImagesJobInterface, "Step", r.Step)
		}
		if r.Total != last.Total {
			setProperty(o.conn, props, path, bus.ImagesJobInterface, "Total", r.Total)
		}
		if line != "" {
			_ = o.conn.Emit(bus.ImagesPath, bus.ImagesInterface+".Progress", path, r.Step, r.Total, boundedText(line))
		}
		if r.State != JobRunning {
			setProperty(o.conn, props, path, bus.ImagesJobInterface, "Tag", r.Tag)
			setProperty(o.conn, props, path, bus.ImagesJobInterface, "Error", boundedText(r.Error))
			setProperty(o.conn, props, path, bus.ImagesJobInterface, "State", r.State)
			if line == "" {
				_ = o.conn.Emit(bus.ImagesPath, bus.ImagesInterface+".Finished", path, r.Tag, boundedText(r.Error))
			}
		}
		last = r
	})
	return nil
}

// boundedText makes s safe for a D-Bus string and caps one line at 4 KiB, so a
// build's runaway line cannot flood a signal.
func boundedText(s string) string {
	s = bus.Text(s)
	if len(s) > 4096 && !strings.Contains(s, "\n") {
		s = strings.ToValidUTF8(s[:4096], "") + "…"
	}
	return s
}

// Export serves dev.berth.Images1 on conn and then takes its name.
func (s *Service) Export(conn *dbus.Conn) error {
	node, err := parseNode()
	if err != nil {
		return err
	}
	obj := &imagesObject{s: s, conn: conn}
	if err := conn.Export(obj, bus.ImagesPath, bus.ImagesInterface); err != nil {
		return fmt.Errorf("cannot export %s: %w", bus.ImagesInterface, err)
	}
	count, err := s.store.countImages()
	if err != nil {
		return err
	}
	exported, err := prop.Export(conn, bus.ImagesPath, prop.Map{bus.ImagesInterface: {
		"Building":   {Value: uint32(s.Building()), Emit: prop.EmitFalse},
		"ImageCount": {Value: uint32(count), Emit: prop.EmitFalse},
	}})
	if err != nil {
		return fmt.Errorf("cannot export properties of %s: %w", bus.ImagesInterface, err)
	}
	main := node
	main.Interfaces = slices.DeleteFunc(slices.Clone(node.Interfaces), func(i introspect.Interface) bool { return i.Name == bus.ImagesJobInterface })
	main.Interfaces = append(main.Interfaces, metrics.IntrospectData())
	if err := metrics.Export(conn, bus.ImagesPath, s.metrics.reg); err != nil {
		return err
	}
	intro, err := introspectable(bus.ImagesPath, main, []introspect.Node{{Name: "job"}})
	if err != nil {
		return err
	}
	if err := conn.Export(intro, bus.ImagesPath, "org.freedesktop.DBus.Introspectable"); err != nil {
		return fmt.Errorf("cannot export introspection of %s: %w", bus.ImagesInterface, err)
	}
	// Parents list their child so `busctl tree` finds the object.
	parts := strings.Split(strings.TrimPrefix(string(bus.ImagesPath), "/"), "/")
	for i := range parts {
		parent := dbus.ObjectPath("/" + strings.Join(parts[:i], "/"))
		child := introspect.NewIntrospectable(&introspect.Node{Children: []introspect.Node{{Name: parts[i]}}})
		if err := conn.Export(child, parent, "org.freedesktop.DBus.Introspectable"); err != nil {
			return fmt.Errorf("cannot export introspection of %s: %w", parent, err)
		}
	}
	s.props.Store(&properties{p: exported, building: uint32(s.Building()), imageCnt: uint32(count)})
	s.conn.Store(conn)
	go s.publish(conn)

	reply, err := conn.RequestName(bus.ImagesName, dbus.NameFlagDoNotQueue)
	if err != nil {
		return fmt.Errorf("cannot own %s: %w", bus.ImagesName, err)
	}
	if reply != dbus.RequestNameReplyPrimaryOwner && reply != dbus.RequestNameReplyAlreadyOwner {
		return fmt.Errorf("cannot own %s: another process owns it (is berth-imaged already running?)", bus.ImagesName)
	}
	return nil
}

// publish updates Building and ImageCount when something changed; it is
// the only sender of their PropertiesChanged, and holds no lock meanwhile.
func (s *Service) publish(conn *dbus.Conn) {
	stop := conn.Context().Done()
	for {
		select {
		case <-stop:
			return
		case <-s.events:
		}
		p := s.props.Load()
		if p == nil {
			continue
		}
		building := uint32(s.Building())
		if building != p.building {
			p.building = building
			setProperty(conn, p.p, bus.ImagesPath, bus.ImagesInterface, "Building", building)
		}
		if n, err := s.store.countImages(); err == nil && uint32(n) != p.imageCnt {
			p.imageCnt = uint32(n)
			setProperty(conn, p.p, bus.ImagesPath, bus.ImagesInterface, "ImageCount", uint32(n))
		}
	}
}

// setProperty stores a property's new value and announces it. The
// properties are exported with EmitFalse and the signal sent here, so a bus
// that is gone (the daemon stopping while a build reports) costs a signal
// nobody would get, not a panic: prop's own emission makes SetMust panic
// when the connection is closed.
func setProperty(conn *dbus.Conn, props *prop.Properties, path dbus.ObjectPath, iface, name string, v any) {
	props.SetMust(iface, name, v)
	_ = conn.Emit(path, "org.freedesktop.DBus.Properties.PropertiesChanged", iface, map[string]dbus.Variant{name: dbus.MakeVariant(v)}, []string{})
}

func parseNode() (introspect.Node, error) {
	var node introspect.Node
	if err := xml.Unmarshal([]byte(units.ImagesXML), &node); err != nil {
		return node, fmt.Errorf("cannot parse the interface XML of %s: %w", bus.ImagesInterface, err)
	}
	return node, nil
}

func jobIntrospection(path dbus.ObjectPath) (introspect.Introspectable, error) {
	node, err := parseNode()
	if err != nil {
		return "", err
	}
	node.Interfaces = slices.DeleteFunc(node.Interfaces, func(i introspect.Interface) bool { return i.Name != bus.ImagesJobInterface })
	return introspectable(path, node, nil)
}

// introspectable is node plus the standard interfaces, each once (not
// introspect.NewIntrospectable: it can add Peer twice).
func introspectable(path dbus.ObjectPath, node introspect.Node, children []introspect.Node) (introspect.Introspectable, error) {
	node.Name = string(path)
	node.Children = children
	for _, std := range []introspect.Interface{prop.IntrospectData, introspect.IntrospectData, introspect.PeerData} {
		if !slices.ContainsFunc(node.Interfaces, func(i introspect.Interface) bool { return i.Name == std.Name }) {
			node.Interfaces = append(node.Interfaces, std)
		}
	}
	b, err := xml.MarshalIndent(&node, "", "  ")
	if err != nil {
		return "", fmt.Errorf("cannot encode interface XML: %w", err)
	}
	return introspect.Introspectable(strings.TrimSpace(introspect.IntrospectDeclarationString) + "\n" + string(b)), nil
}
