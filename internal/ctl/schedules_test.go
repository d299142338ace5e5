package ctl

import (
	"bytes"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/busapi"
)

func TestTheSchedulesListingMatchesItsGoldenFile(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	err := writeScheduleList(&b, []busapi.Schedule{
		{ID: "heartbeat", Agent: "helper", OnCalendar: "*-*-* *:00/30:00", Connector: "slack", Channel: "C0123456",
			Next: at.Add(30 * time.Minute), LastStart: at, LastEnd: at.Add(4 * time.Second), LastState: "succeeded"},
		{ID: "nightly", Agent: "helper", OnCalendar: "*-*-* 02:00:00", Connector: "hooks", Channel: "ops", Thread: "builds",
			Next: at.Add(16*time.Hour + 30*time.Minute), LastStart: at.Add(-7*time.Hour - 30*time.Minute), LastState: "failed", LastDetail: "run 20261201T020000_1_cc failed: timeout"},
		{ID: "standup", Agent: "helper", OnCalendar: "Mon..Fri *-*-* 09:00:00 Europe/Berlin", Connector: "hooks", Channel: "ops",
			Next: at.Add(23*time.Hour + 30*time.Minute)},
	})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "schedules.txt", b.Bytes())
}

func TestNoSchedulesSaysWhereTheyAreConfigured(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := writeScheduleList(&b, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := b.String(), "no schedules: add [[schedules]] to berth.toml\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
