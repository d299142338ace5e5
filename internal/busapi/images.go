package busapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/bus"
)

// Images is a client of dev.berth.Images1. Calls may start berth-imaged by
// D-Bus activation.
type Images struct {
	conn *dbus.Conn
}

// NewImages is a client of berth-imaged on conn.
func NewImages(conn *dbus.Conn) Images { return Images{conn: conn} }

func (im Images) call(ctx context.Context, method string, args []any, results ...any) error {
	return call(ctx, im.conn.Object(bus.ImagesName, bus.ImagesPath), 0, bus.ImagesInterface, method, args, results...)
}

// EnsureIsolationImage returns the tag of the agent's isolation image,
// building it first when the engine lacks it.
func (im Images) EnsureIsolationImage(ctx context.Context, agent string) (string, error) {
	var tag string
	err := im.call(ctx, "EnsureIsolationImage", []any{agent}, &tag)
	return tag, err
}

// EnsureOptions are EnsureIsolationImageWith's options.
type EnsureOptions struct {
	// Traceparent is the W3C trace context of the caller's span, the
	// parent of berth-imaged's; "" when the caller traces nothing.
	Traceparent string
}

// Wire is o as EnsureIsolationImageWith takes it (a{sv}); an empty option
// sends no key.
func (o EnsureOptions) Wire() map[string]dbus.Variant {
	m := map[string]dbus.Variant{}
	if o.Traceparent != "" {
		m["traceparent"] = dbus.MakeVariant(o.Traceparent)
	}
	return m
}

// EnsureOptionsFromWire reads EnsureIsolationImageWith's options; an
// unknown key or a value of the wrong type is refused (the errors wrap
// ErrInvalid).
func EnsureOptionsFromWire(m map[string]dbus.Variant) (EnsureOptions, error) {
	var o EnsureOptions
	for k, v := range m {
		var ok bool
		switch k {
		case "traceparent":
			if o.Traceparent, ok = v.Value().(string); !ok {
				return EnsureOptions{}, invalid("traceparent must be a string, not %s", v.Signature())
			}
		default:
			return EnsureOptions{}, invalid("unknown option %q (known: traceparent)", k)
		}
	}
	return o, nil
}

// EnsureIsolationImageWith is EnsureIsolationImage with options. A
// berth-imaged older than the method (an upgrade under way) is asked
// EnsureIsolationImage instead: it gets the image, not the trace.
func (im Images) EnsureIsolationImageWith(ctx context.Context, agent string, opts EnsureOptions) (string, error) {
	var tag string
	err := im.call(ctx, "EnsureIsolationImageWith", []any{agent, opts.Wire()}, &tag)
	var derr dbus.Error
	if errors.As(err, &derr) && derr.Name == unknownMethod {
		return im.EnsureIsolationImage(ctx, agent)
	}
	return tag, err
}

// unknownMethod is the error a D-Bus service answers a method it lacks with.
const unknownMethod = "org.freedesktop.DBus.Error.UnknownMethod"

// BuildTarget is what Build builds.
type BuildTarget struct {
	Target  string // an agent id, or "default" (the global [image_config])
	NoCache bool
	// Traceparent is the caller's span, the parent of the build's job
	// span; "" (no key sent) makes the job a trace of its own.
	Traceparent string
}

// Wire is t as Build takes it (a{sv}).
func (t BuildTarget) Wire() map[string]dbus.Variant {
	m := map[string]dbus.Variant{"target": dbus.MakeVariant(t.Target), "no_cache": dbus.MakeVariant(t.NoCache)}
	if t.Traceparent != "" {
		m["traceparent"] = dbus.MakeVariant(t.Traceparent)
	}
	return m
}

// BuildTargetFromWire reads Build's argument; an unknown key or a value of
// the wrong type is refused (the errors wrap ErrInvalid).
func BuildTargetFromWire(m map[string]dbus.Variant) (BuildTarget, error) {
	var t BuildTarget
	for k, v := range m {
		var ok bool
		switch k {
		case "target":
			if t.Target, ok = v.Value().(string); !ok {
				return BuildTarget{}, invalid("target must be a string, not %s", v.Signature())
			}
		case "no_cache":
			if t.NoCache, ok = v.Value().(bool); !ok {
				return BuildTarget{}, invalid("no_cache must be a boolean, not %s", v.Signature())
			}
		case "traceparent":
			if t.Traceparent, ok = v.Value().(string); !ok {
				return BuildTarget{}, invalid("traceparent must be a string, not %s", v.Signature())
			}
		default:
			return BuildTarget{}, invalid("unknown build option %q (known: target, no_cache, traceparent)", k)
		}
	}
	return t, nil
}

// Build starts a build and returns its job, already subscribed to the
// job's signals: Follow misses none of them.
func (im Images) Build(ctx context.Context, t BuildTarget) (*BuildJob, error) {
	callCtx, cancel := callContext(ctx)
	defer cancel()
	opts := []dbus.MatchOption{dbus.WithMatchInterface(bus.ImagesInterface), dbus.WithMatchObjectPath(bus.ImagesPath)}
	if err := im.conn.AddMatchSignalContext(callCtx, opts...); err != nil {
		return nil, fmt.Errorf("cannot follow builds: %w", err)
	}
	signals := make(chan *dbus.Signal, 4096)
	im.conn.Signal(signals)
	var path dbus.ObjectPath
	if err := im.call(ctx, "Build", []any{t.Wire()}, &path); err != nil {
		im.conn.RemoveSignal(signals)
		return nil, err
	}
	return &BuildJob{conn: im.conn, Path: path, signals: signals}, nil
}

// Image is one entry of ListImages.
type Image struct {
	Tag      string            `json:"tag"`
	Kind     string            `json:"kind"` // sandbox | isolated
	Hash     string            `json:"hash"`
	Status   string            `json:"status"` // ready | building | failed
	Present  bool              `json:"present"`
	Size     int64             `json:"size"`
	Created  string            `json:"created"`
	LastUsed string            `json:"last_used"`
	Agents   []string          `json:"agents"`
	Inputs   map[string]string `json:"inputs"`
	Error    string            `json:"error,omitempty"`
	LogTail  []string          `json:"log_tail,omitempty"`
}

// Wire is img as ListImages returns it (a{sv}).
func (img Image) Wire() map[string]dbus.Variant {
	return map[string]dbus.Variant{
		"tag":       dbus.MakeVariant(img.Tag),
		"kind":      dbus.MakeVariant(img.Kind),
		"hash":      dbus.MakeVariant(img.Hash),
		"inputs":    dbus.MakeVariant(img.Inputs),
		"status":    dbus.MakeVariant(img.Status),
		"present":   dbus.MakeVariant(img.Present),
		"size":      dbus.MakeVariant(img.Size),
		"created":   dbus.MakeVariant(img.Created),
		"last_used": dbus.MakeVariant(img.LastUsed),
		"agents":    dbus.MakeVariant(img.Agents),
		"error":     dbus.MakeVariant(img.Error),
		"log_tail":  dbus.MakeVariant(img.LogTail),
	}
}

// ImageFromWire reads one entry of what ListImages returned.
func ImageFromWire(m map[string]dbus.Variant) (Image, error) {
	var r Image
	f := fields{m: m}
	f.str("tag", &r.Tag)
	f.str("kind", &r.Kind)
	f.str("hash", &r.Hash)
	f.str("status", &r.Status)
	f.boolean("present", &r.Present)
	f.get("size", &r.Size)
	f.str("created", &r.Created)
	f.str("last_used", &r.LastUsed)
	f.get("agents", &r.Agents)
	f.get("inputs", &r.Inputs)
	f.str("error", &r.Error)
	f.get("log_tail", &r.LogTail)
	if f.err != nil {
		return Image{}, fmt.Errorf("cannot read image: %w", f.err)
	}
	return r, nil
}

// ListImages returns berth's images, its records joined with the engine's.
func (im Images) ListImages(ctx context.Context) ([]Image, error) {
	var raw []map[string]dbus.Variant
	if err := im.call(ctx, "ListImages", nil, &raw); err != nil {
		return nil, err
	}
	return listFromWire(raw, ImageFromWire)
}

// Dockerfile returns the Dockerfiles a target's images are built from.
func (im Images) Dockerfile(ctx context.Context, target string) (string, error) {
	var df string
	err := im.call(ctx, "Dockerfile", []any{target}, &df)
	return df, err
}

// Remove removes one berth image.
func (im Images) Remove(ctx context.Context, tag string) error {
	return im.call(ctx, "Remove", []any{tag})
}

// Clean removes the images no agent uses (all: every berth image) and
// returns their tags.
func (im Images) Clean(ctx context.Context, all bool) ([]string, error) {
	var removed []string
	err := im.call(ctx, "Clean", []any{all}, &removed)
	return removed, err
}

// ImagesStatus holds berth-imaged's properties.
type ImagesStatus struct {
	Building   uint32
	ImageCount uint32
}

// Properties reads berth-imaged's properties without starting it.
func (im Images) Properties(ctx context.Context) (ImagesStatus, error) {
	props, err := getAll(ctx, im.conn.Object(bus.ImagesName, bus.ImagesPath), bus.ImagesInterface)
	if err != nil {
		return ImagesStatus{}, err
	}
	var st ImagesStatus
	f := fields{m: props}
	f.u32("Building", &st.Building)
	f.u32("ImageCount", &st.ImageCount)
	return st, f.err
}

// BuildJob is one build (dev.berth.Images1.Job).
type BuildJob struct {
	conn    *dbus.Conn
	Path    dbus.ObjectPath
	signals chan *dbus.Signal
}

// Cancel stops the build; the job ends as canceled.
func (j *BuildJob) Cancel(ctx context.Context) error {
	return call(ctx, j.conn.Object(bus.ImagesName, j.Path), 0, bus.ImagesJobInterface, "Cancel", nil)
}

// JobStatus holds a job's properties.
type JobStatus struct {
	State  string // running | succeeded | failed | canceled
	Target string
	Step   uint32
	Total  uint32
	Tag    string
	Error  string
}

// Properties reads the job's properties.
func (j *BuildJob) Properties(ctx context.Context) (JobStatus, error) {
	props, err := getAll(ctx, j.conn.Object(bus.ImagesName, j.Path), bus.ImagesJobInterface)
	if err != nil {
		return JobStatus{}, err
	}
	var st JobStatus
	f := fields{m: props}
	f.str("State", &st.State)
	f.str("Target", &st.Target)
	f.u32("Step", &st.Step)
	f.u32("Total", &st.Total)
	f.str("Tag", &st.Tag)
	f.str("Error", &st.Error)
	return st, f.err
}

// Progress is one event of a build: a line of output (step of total), or,
// with Finished, its end: the tag on success, else Error. Lost says the job
// could not be read any more (berth-imaged stopped); it is the last event.
type Progress struct {
	Step, Total uint32
	Line        string
	Finished    bool
	Tag, Error  string
	Lost        error
}

// jobPollInterval is how often Follow reads the job's state, in case a
// signal was lost: a lost Finished must not leave the follower waiting.
const jobPollInterval = 2 * time.Second

// Follow delivers the job's progress until it finishes (the last event has
// Finished or Lost) or ctx is done; then the channel is closed. Call it
// once.
func (j *BuildJob) Follow(ctx context.Context) <-chan Progress {
	out := make(chan Progress, 64)
	go func() {
		defer close(out)
		defer j.conn.RemoveSignal(j.signals)
		poll := time.NewTicker(jobPollInterval)
		defer poll.Stop()
		send := func(p Progress) bool {
			select {
			case out <- p:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-poll.C:
				st, err := j.Properties(ctx)
				if err != nil {
					send(Progress{Lost: fmt.Errorf("lost job %s (did berth-imaged stop?): %w", j.Path, err)})
					return
				}
				if st.State != "running" {
					send(Progress{Finished: true, Tag: st.Tag, Error: st.Error})
					return
				}
			case sig := <-j.signals:
				p, ok := j.progressOf(sig)
				if !ok {
					continue
				}
				if !send(p) || p.Finished {
					return
				}
			}
		}
	}()
	return out
}

// progressOf decodes a Progress or Finished signal of this job.
func (j *BuildJob) progressOf(sig *dbus.Signal) (Progress, bool) {
	if sig == nil {
		return Progress{}, false
	}
	var job dbus.ObjectPath
	var p Progress
	switch sig.Name {
	case bus.ImagesInterface + ".Progress":
		if dbus.Store(sig.Body, &job, &p.Step, &p.Total, &p.Line) != nil {
			return Progress{}, false
		}
	case bus.ImagesInterface + ".Finished":
		if dbus.Store(sig.Body, &job, &p.Tag, &p.Error) != nil {
			return Progress{}, false
		}
		p.Finished = true
	default:
		return Progress{}, false
	}
	return p, job == j.Path
}
