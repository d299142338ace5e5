package busapi

import (
	"context"
	"time"

	"github.com/godbus/dbus/v5"
)

// Schedule is one scheduled job as ListSchedules gives it: what it is,
// when it fires next and how its last firing went.
type Schedule struct {
	ID         string `json:"id"`
	Agent      string `json:"agent"`
	OnCalendar string `json:"on_calendar"` // normalized
	// Connector, Channel and Thread are where its replies go.
	Connector string    `json:"connector"`
	Channel   string    `json:"channel"`
	Thread    string    `json:"thread,omitempty"`
	Next      time.Time `json:"next,omitzero"` // zero: never again
	LastStart time.Time `json:"last_start,omitzero"`
	LastEnd   time.Time `json:"last_end,omitzero"`
	// LastState is "" (never fired), running, succeeded, failed or skipped;
	// LastDetail says why it failed or was skipped.
	LastState  string `json:"last_state"`
	LastDetail string `json:"last_detail,omitempty"`
	// LastRun is the last firing's run ("" when it started none).
	LastRun string `json:"last_run,omitempty"`
	Running bool   `json:"running"`
}

// Wire is the schedule as an a{sv} entry of ListSchedules.
func (s Schedule) Wire() map[string]dbus.Variant {
	return map[string]dbus.Variant{
		"id":              dbus.MakeVariant(s.ID),
		"agent":           dbus.MakeVariant(s.Agent),
		"on_calendar":     dbus.MakeVariant(s.OnCalendar),
		"connector":       dbus.MakeVariant(s.Connector),
		"channel":         dbus.MakeVariant(s.Channel),
		"thread":          dbus.MakeVariant(s.Thread),
		"next_usec":       usecVariant(s.Next),
		"last_start_usec": usecVariant(s.LastStart),
		"last_end_usec":   usecVariant(s.LastEnd),
		"last_state":      dbus.MakeVariant(s.LastState),
		"last_detail":     dbus.MakeVariant(s.LastDetail),
		"last_run_id":     dbus.MakeVariant(s.LastRun),
		"running":         dbus.MakeVariant(s.Running),
	}
}

// ScheduleFromWire reads one entry of ListSchedules.
func ScheduleFromWire(m map[string]dbus.Variant) (Schedule, error) {
	var s Schedule
	f := fields{m: m}
	f.str("id", &s.ID)
	f.str("agent", &s.Agent)
	f.str("on_calendar", &s.OnCalendar)
	f.str("connector", &s.Connector)
	f.str("channel", &s.Channel)
	f.str("thread", &s.Thread)
	f.usec("next_usec", &s.Next)
	f.usec("last_start_usec", &s.LastStart)
	f.usec("last_end_usec", &s.LastEnd)
	f.str("last_state", &s.LastState)
	f.str("last_detail", &s.LastDetail)
	f.str("last_run_id", &s.LastRun)
	f.boolean("running", &s.Running)
	if f.err == nil && s.ID == "" {
		return Schedule{}, invalid("a schedule without an id")
	}
	return s, f.err
}

// FireSchedule fires a job as its systemd timer does (active hours apply)
// and returns what became of the firing: started, queued or skipped. Root
// only: the timers' services call it.
func (s Scheduler) FireSchedule(ctx context.Context, id string) (string, error) {
	var outcome string
	err := s.call(ctx, "FireSchedule", []any{id}, &outcome)
	return outcome, err
}

// RunSchedule fires a job now, whatever its active hours (berthctl
// schedules run); the overlap rule still applies.
func (s Scheduler) RunSchedule(ctx context.Context, id string) (string, error) {
	var outcome string
	err := s.call(ctx, "RunSchedule", []any{id}, &outcome)
	return outcome, err
}

// ListSchedules is every scheduled job, by id.
func (s Scheduler) ListSchedules(ctx context.Context) ([]Schedule, error) {
	var raw []map[string]dbus.Variant
	if err := s.call(ctx, "ListSchedules", nil, &raw); err != nil {
		return nil, err
	}
	return listFromWire(raw, ScheduleFromWire)
}
