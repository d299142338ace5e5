package schedules

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"

	"github.com/berth-dev/berth/internal/backoff"
	"github.com/berth-dev/berth/internal/bus"
)

// UnitPrefix begins the name of every schedule's timer and service.
const UnitPrefix = "berth-schedule-"

// FireMethod is the Scheduler1 method a timer's service calls with the
// job's id.
const FireMethod = "FireSchedule"

// TimerName is the job's timer unit.
func TimerName(id string) string { return UnitPrefix + id + ".timer" }

// ServiceName is the unit the job's timer starts.
func ServiceName(id string) string { return UnitPrefix + id + ".service" }

// SystemdTimers keeps the jobs' time in systemd: one transient timer per job.
type SystemdTimers struct {
	// Busctl is the busctl the services run (default: /usr/bin/busctl,
	// else the one on PATH).
	Busctl string
	Logger *slog.Logger
	// connect reaches systemd (default: the system bus); tests replace it.
	connect func(ctx context.Context) (systemdConn, error)
}

// systemdConn is the part of systemd's bus API the timers use.
type systemdConn interface {
	ListUnitsByPatternsContext(ctx context.Context, states, patterns []string) ([]sdbus.UnitStatus, error)
	StartTransientUnitAux(ctx context.Context, name, mode string, props []sdbus.Property, aux []sdbus.PropertyCollection, ch chan<- string) (int, error)
	StopUnitContext(ctx context.Context, name, mode string, ch chan<- string) (int, error)
	ResetFailedUnitContext(ctx context.Context, name string) error
	Close()
}

// callTimeout bounds each call to systemd, and jobTimeout the wait for a
// job it queued (a start or a stop).
const (
	callTimeout = 10 * time.Second
	jobTimeout  = 30 * time.Second
)

// Reconcile makes systemd's berth-schedule-*.timer units the jobs': it
// creates the missing ones, replaces the ones whose properties changed
// (or that failed), and removes the ones no job has. A unit's properties
// are fingerprinted in its Description, so an unchanged job's timer, and
// the stamp Persistent=true keeps for it, are left alone.
func (s *SystemdTimers) Reconcile(ctx context.Context, jobs []Job) error {
	want := make(map[string]timerUnit, len(jobs))
	for _, j := range jobs {
		c, err := compile(j)
		if err != nil {
			return err
		}
		want[j.ID] = s.unit(c)
	}
	connect := s.connect
	if connect == nil {
		connect = func(ctx context.Context) (systemdConn, error) { return sdbus.NewSystemdConnectionContext(ctx) }
	}
	conn, err := connect(ctx)
	if err != nil {
		return fmt.Errorf("cannot connect to systemd: %w", err)
	}
	defer conn.Close()
	listCtx, cancel := context.WithTimeout(ctx, callTimeout)
	have, err := conn.ListUnitsByPatternsContext(listCtx, nil, []string{UnitPrefix + "*.timer"})
	cancel()
	if err != nil {
		return fmt.Errorf("cannot list the schedules' timers: %w", err)
	}
	var errs []error
	for _, a := range plan(have, want) {
		if err := s.apply(ctx, conn, a); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// timerUnit is what systemd is sent for one job: the timer, and its
// service as the auxiliary unit.
type timerUnit struct {
	id          string
	description string // carries the fingerprint of both
	timer       []sdbus.Property
	service     []sdbus.Property
}

func (s *SystemdTimers) unit(c compiled) timerUnit {
	id := c.job.ID
	busctl := s.Busctl
	if busctl == "" {
		busctl = defaultBusctl()
	}
	// The job's id is the call's only argument: the scheduler reads
	// everything else from its own configuration, so the unit holds no
	// prompt, no destination and no secret.
	call := []string{busctl, "call", "--system", "--timeout=30s",
		bus.SchedulerName, string(bus.SchedulerPath), bus.SchedulerInterface, FireMethod, "s", id}
	timer := []sdbus.Property{
		prop("TimersCalendar", []calendarTimer{{Base: "OnCalendar", Spec: c.spec.String()}}),
		// A firing missed while the machine was off (or systemd was
		// stopped) happens once when the timer comes back.
		prop("Persistent", true),
		// systemd's default slack is a minute; a job at 09:00 should not
		// start at 09:00:47.
		prop("AccuracyUSec", uint64(time.Second/time.Microsecond)),
	}
	service := []sdbus.Property{
		prop("Type", "oneshot"),
		sdbus.PropExecStart(call, true),
		prop("TimeoutStartUSec", uint64(time.Minute/time.Microsecond)),
		prop("NoNewPrivileges", true),
		prop("ProtectSystem", "strict"),
		prop("ProtectHome", "yes"),
		prop("PrivateTmp", true),
	}
	sum := sha256.New()
	fmt.Fprintf(sum, "%v\n%v", timer, service)
	description := fmt.Sprintf("berth schedule %s (%s) #%s", id, c.spec.String(), hex.EncodeToString(sum.Sum(nil))[:12])
	return timerUnit{
		id:          id,
		description: description,
		timer:       append([]sdbus.Property{prop("Description", description)}, timer...),
		service:     append([]sdbus.Property{prop("Description", "Fire berth schedule "+id)}, service...),
	}
}

// defaultBusctl is systemd's busctl: /usr/bin/busctl where it is (one
// fixed path, so the units' fingerprint does not follow $PATH), else the
// one on PATH.
func defaultBusctl() string {
	const usual = "/usr/bin/busctl"
	if _, err := os.Stat(usual); err == nil {
		return usual
	}
	if p, err := exec.LookPath("busctl"); err == nil {
		return p
	}
	return usual
}

// calendarTimer is one element of a timer's TimersCalendar, a(ss).
type calendarTimer struct {
	Base string
	Spec string
}

func prop(name string, value any) sdbus.Property {
	return sdbus.Property{Name: name, Value: dbus.MakeVariant(value)}
}

type actionKind int

const (
	create actionKind = iota
	replace
	remove
)

func (k actionKind) String() string { return [...]string{"create", "replace", "remove"}[k] }

type action struct {
	kind actionKind
	id   string
	unit timerUnit // create and replace
}

// plan is what turns the timers systemd has into the ones wanted, in id order.
func plan(have []sdbus.UnitStatus, want map[string]timerUnit) []action {
	var out []action
	seen := map[string]bool{}
	for _, u := range have {
		id, ok := strings.CutPrefix(u.Name, UnitPrefix)
		if !ok {
			continue
		}
		id, ok = strings.CutSuffix(id, ".timer")
		if !ok {
			continue
		}
		seen[id] = true
		w, wanted := want[id]
		switch {
		case !wanted:
			out = append(out, action{kind: remove, id: id})
		case u.Description != w.description || u.LoadState != "loaded" || u.ActiveState != "active":
			out = append(out, action{kind: replace, id: id, unit: w})
		}
	}
	for id, w := range want {
		if !seen[id] {
			out = append(out, action{kind: create, id: id, unit: w})
		}
	}
	slices.SortFunc(out, func(a, b action) int { return strings.Compare(a.id, b.id) })
	return out
}

func (s *SystemdTimers) apply(ctx context.Context, conn systemdConn, a action) error {
	log := s.Logger
	if log == nil {
		log = slog.Default()
	}
	if a.kind != create {
		for _, name := range []string{TimerName(a.id), ServiceName(a.id)} {
			if err := stopUnit(ctx, conn, name); err != nil {
				return fmt.Errorf("cannot %s the timer of schedule %q: %w", a.kind, a.id, err)
			}
		}
	}
	if a.kind != remove {
		if err := startTimer(ctx, conn, a.unit); err != nil {
			return fmt.Errorf("cannot %s the timer of schedule %q: %w", a.kind, a.id, err)
		}
	}
	log.Info("schedule's timer "+map[actionKind]string{create: "created", replace: "replaced", remove: "removed"}[a.kind], "schedule", a.id, "unit", TimerName(a.id))
	return nil
}

// retry spaces the starts of a timer whose stopped predecessor systemd has
// not unloaded yet.
var retry = backoff.Policy{Min: 20 * time.Millisecond, Max: time.Second}

func startTimer(ctx context.Context, conn systemdConn, u timerUnit) error {
	ctx, cancel := context.WithTimeout(ctx, jobTimeout)
	defer cancel()
	aux := []sdbus.PropertyCollection{{Name: ServiceName(u.id), Properties: u.service}}
	for attempt := 1; ; attempt++ {
		done := make(chan string, 1)
		callCtx, callCancel := context.WithTimeout(ctx, callTimeout)
		_, err := conn.StartTransientUnitAux(callCtx, TimerName(u.id), "fail", u.timer, aux, done)
		callCancel()
		if err == nil {
			select {
			case result := <-done:
				if result != "done" {
					return fmt.Errorf("systemd's start job ended %q", result)
				}
				return nil
			case <-ctx.Done():
				return fmt.Errorf("systemd did not start %s in time: %w", TimerName(u.id), ctx.Err())
			}
		}
		if !alreadyLoaded(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("systemd still holds the old %s: %w", TimerName(u.id), err)
		case <-time.After(retry.Delay(attempt)):
		}
	}
}

// alreadyLoaded says whether systemd refused a transient unit because a
// unit of that name is still loaded.
func alreadyLoaded(err error) bool {
	var de dbus.Error
	if errors.As(err, &de) && de.Name == "org.freedesktop.systemd1.UnitExists" {
		return true
	}
	return strings.Contains(err.Error(), "already exists")
}

// stopUnit stops a unit, waits for the stop and clears a failed state so
// its name is free. A unit that is not there is not an error.
func stopUnit(ctx context.Context, conn systemdConn, name string) error {
	ctx, cancel := context.WithTimeout(ctx, jobTimeout)
	defer cancel()
	done := make(chan string, 1)
	callCtx, callCancel := context.WithTimeout(ctx, callTimeout)
	_, err := conn.StopUnitContext(callCtx, name, "replace", done)
	callCancel()
	switch {
	case err == nil:
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("systemd did not stop %s in time: %w", name, ctx.Err())
		}
	case !notLoaded(err):
		return err
	}
	resetCtx, resetCancel := context.WithTimeout(ctx, callTimeout)
	defer resetCancel()
	_ = conn.ResetFailedUnitContext(resetCtx, name) // nothing to reset is fine
	return nil
}

func notLoaded(err error) bool {
	var de dbus.Error
	if errors.As(err, &de) && de.Name == "org.freedesktop.systemd1.NoSuchUnit" {
		return true
	}
	return strings.Contains(err.Error(), "not loaded")
}
