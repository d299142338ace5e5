package busapi

import (
	"context"
	"time"

	"github.com/godbus/dbus/v5"
)

// Sandbox is one live conversation sandbox as ListSandboxes gives it
// (issue 22): whose it is, where it runs, how active it has been.
type Sandbox struct {
	ID    string `json:"id"`
	Agent string `json:"agent"`
	// Connector, Channel and Thread are its conversation, verbatim.
	Connector string `json:"connector"`
	Channel   string `json:"channel"`
	Thread    string `json:"thread"`
	Backend   string `json:"backend"`
	// Started and LastActivity are on the scheduler's clock; IdleFor is 0
	// while a run is under way (Busy).
	Started      time.Time     `json:"started"`
	LastActivity time.Time     `json:"last_activity"`
	IdleFor      time.Duration `json:"idle_for_ns"`
	Busy         bool          `json:"busy"`
	Runs         uint32        `json:"runs"`
	// MemoryBytes is what every process of it uses now; -1 when it cannot
	// be measured.
	MemoryBytes int64 `json:"memory_bytes"`
	// MemoryUnknown is why MemoryBytes is -1 (the backend's error).
	MemoryUnknown string `json:"memory_unknown,omitempty"`
}

// Wire is the sandbox as an a{sv} entry of ListSandboxes.
func (s Sandbox) Wire() map[string]dbus.Variant {
	return map[string]dbus.Variant{
		"id":                 dbus.MakeVariant(s.ID),
		"agent":              dbus.MakeVariant(s.Agent),
		"connector":          dbus.MakeVariant(s.Connector),
		"channel":            dbus.MakeVariant(s.Channel),
		"thread":             dbus.MakeVariant(s.Thread),
		"backend":            dbus.MakeVariant(s.Backend),
		"started_usec":       usecVariant(s.Started),
		"last_activity_usec": usecVariant(s.LastActivity),
		"idle_usec":          dbus.MakeVariant(uint64(max(s.IdleFor, 0).Microseconds())),
		"busy":               dbus.MakeVariant(s.Busy),
		"runs":               dbus.MakeVariant(s.Runs),
		"memory_bytes":       dbus.MakeVariant(s.MemoryBytes),
		"memory_unknown":     dbus.MakeVariant(s.MemoryUnknown),
	}
}

// SandboxFromWire reads one entry of ListSandboxes.
func SandboxFromWire(m map[string]dbus.Variant) (Sandbox, error) {
	var s Sandbox
	f := fields{m: m}
	f.str("id", &s.ID)
	f.str("agent", &s.Agent)
	f.str("connector", &s.Connector)
	f.str("channel", &s.Channel)
	f.str("thread", &s.Thread)
	f.str("backend", &s.Backend)
	f.usec("started_usec", &s.Started)
	f.usec("last_activity_usec", &s.LastActivity)
	var idle uint64
	f.get("idle_usec", &idle)
	s.IdleFor = time.Duration(idle) * time.Microsecond
	f.boolean("busy", &s.Busy)
	f.u32("runs", &s.Runs)
	s.MemoryBytes = -1
	f.get("memory_bytes", &s.MemoryBytes)
	f.str("memory_unknown", &s.MemoryUnknown)
	if f.err == nil && s.ID == "" {
		return Sandbox{}, invalid("a sandbox without an id")
	}
	return s, f.err
}

// ListSandboxes returns the live conversation sandboxes of agent ("" for
// every agent), oldest first. Reading them is not activity.
func (s Scheduler) ListSandboxes(ctx context.Context, agent string) ([]Sandbox, error) {
	var list []map[string]dbus.Variant
	if err := s.call(ctx, "ListSandboxes", []any{agent}, &list); err != nil {
		return nil, err
	}
	return listFromWire(list, SandboxFromWire)
}

// StopSandbox stops a live sandbox without a run under way (SIGTERM, a
// grace, SIGKILL); its conversation's next message gets a fresh one.
func (s Scheduler) StopSandbox(ctx context.Context, id string) error {
	return s.call(ctx, "StopSandbox", []any{id})
}
