package schedules

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
)

func standupJob() Job {
	return Job{
		ID:         "standup",
		OnCalendar: "mon..fri 9:00 Europe/Berlin",
		Agent:      "helper",
		Prompt:     "Summarise yesterday's tickets for the on-call",
		DeliverTo:  Destination{Connector: "hooks", Channel: "ops-private", Thread: "t-42"},
	}
}

func unitOf(t *testing.T, s *SystemdTimers, j Job) timerUnit {
	t.Helper()
	c, err := compile(j)
	if err != nil {
		t.Fatal(err)
	}
	return s.unit(c)
}

func property(t *testing.T, props []sdbus.Property, name string) any {
	t.Helper()
	for _, p := range props {
		if p.Name == name {
			return p.Value.Value()
		}
	}
	t.Fatalf("no property %s in %v", name, props)
	return nil
}

func TestTheTimerSentForAJob(t *testing.T) {
	t.Parallel()
	u := unitOf(t, &SystemdTimers{Busctl: "/usr/bin/busctl"}, standupJob())

	t.Run("Fires_on_the_normalized_calendar_persistently_to_the_second", func(t *testing.T) {
		cal := property(t, u.timer, "TimersCalendar")
		if want := []calendarTimer{{"OnCalendar", "Mon..Fri *-*-* 09:00:00 Europe/Berlin"}}; !reflect.DeepEqual(cal, want) {
			t.Errorf("TimersCalendar %v, want %v", cal, want)
		}
		if p := property(t, u.timer, "Persistent"); p != true {
			t.Errorf("Persistent %v: a firing missed while the machine was off would be lost", p)
		}
		if a := property(t, u.timer, "AccuracyUSec"); a != uint64(1_000_000) {
			t.Errorf("AccuracyUSec %v, want one second", a)
		}
	})

	t.Run("Its_service_calls_FireSchedule_with_the_id", func(t *testing.T) {
		if typ := property(t, u.service, "Type"); typ != "oneshot" {
			t.Errorf("Type %v", typ)
		}
		exec := fmt.Sprint(property(t, u.service, "ExecStart"))
		want := "/usr/bin/busctl [/usr/bin/busctl call --system --timeout=30s dev.berth.Scheduler1 /dev/berth/Scheduler1 dev.berth.Scheduler1 FireSchedule s standup]"
		if !strings.Contains(exec, want) {
			t.Errorf("ExecStart %s, want %s", exec, want)
		}
		if nnp := property(t, u.service, "NoNewPrivileges"); nnp != true {
			t.Errorf("NoNewPrivileges %v", nnp)
		}
	})

	t.Run("Holds_nothing_of_the_job_but_its_id_and_calendar", func(t *testing.T) {
		all := fmt.Sprint(u.timer, u.service)
		for _, private := range []string{"Summarise", "ops-private", "t-42", "helper", "hooks"} {
			if strings.Contains(all, private) {
				t.Errorf("the units carry %q, which anyone can read with systemctl show:\n%s", private, all)
			}
		}
	})

	t.Run("Is_named_after_the_job", func(t *testing.T) {
		if TimerName("standup") != "berth-schedule-standup.timer" || ServiceName("standup") != "berth-schedule-standup.service" {
			t.Errorf("names %s, %s", TimerName("standup"), ServiceName("standup"))
		}
		if d := property(t, u.timer, "Description"); d != u.description || !strings.HasPrefix(u.description, "berth schedule standup (Mon..Fri *-*-* 09:00:00 Europe/Berlin) #") {
			t.Errorf("Description %v", d)
		}
	})
}

func TestTheFingerprintChangesWithWhatIsSentOnly(t *testing.T) {
	t.Parallel()
	s := &SystemdTimers{Busctl: "/usr/bin/busctl"}
	base := unitOf(t, s, standupJob())
	samePrompt := standupJob()
	samePrompt.Prompt = "Another prompt"
	samePrompt.OnCalendar = "Mon..Fri 09:00:00 Europe/Berlin" // the same calendar, written differently
	if got := unitOf(t, s, samePrompt).description; got != base.description {
		t.Errorf("a change the timer does not carry replaces it: %q, was %q", got, base.description)
	}
	moved := standupJob()
	moved.OnCalendar = "Mon..Fri 09:30 Europe/Berlin"
	if got := unitOf(t, s, moved).description; got == base.description {
		t.Errorf("a changed calendar keeps the description %q", got)
	}
	if got := unitOf(t, &SystemdTimers{Busctl: "/opt/bin/busctl"}, standupJob()).description; got == base.description {
		t.Errorf("a changed command keeps the description %q", got)
	}
}

func TestReconcilePlansCreateReplaceAndRemove(t *testing.T) {
	t.Parallel()
	s := &SystemdTimers{Busctl: "/usr/bin/busctl"}
	job := func(id, cal string) timerUnit {
		j := standupJob()
		j.ID, j.OnCalendar = id, cal
		return unitOf(t, s, j)
	}
	want := map[string]timerUnit{
		"kept":    job("kept", "daily"),
		"changed": job("changed", "hourly"),
		"failed":  job("failed", "weekly"),
		"new":     job("new", "monthly"),
	}
	have := []sdbus.UnitStatus{
		{Name: TimerName("kept"), Description: want["kept"].description, LoadState: "loaded", ActiveState: "active"},
		{Name: TimerName("changed"), Description: job("changed", "minutely").description, LoadState: "loaded", ActiveState: "active"},
		{Name: TimerName("failed"), Description: want["failed"].description, LoadState: "loaded", ActiveState: "failed"},
		{Name: TimerName("gone"), Description: "berth schedule gone (…)", LoadState: "loaded", ActiveState: "active"},
		{Name: "berth-schedule-odd.service", LoadState: "loaded", ActiveState: "inactive"},
	}
	var got []string
	for _, a := range plan(have, want) {
		got = append(got, a.kind.String()+" "+a.id)
		if a.kind != remove && a.unit.id != a.id {
			t.Errorf("%s %s carries the unit of %s", a.kind, a.id, a.unit.id)
		}
	}
	// in id order; the unrelated .service and the kept timer are left alone
	if want := []string{"replace changed", "replace failed", "remove gone", "create new"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("plan %v, want %v", got, want)
	}
}
