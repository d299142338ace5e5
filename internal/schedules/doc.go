// Package schedules fires scheduled jobs ([[schedules]] in berth.toml):
// each job's calendar expression says when, and a Fire callback the
// scheduler supplies turns a firing into a normal run.
//
// Who keeps the time depends on the host. Under systemd each job is a
// transient berth-schedule-<id>.timer (Persistent=true, so a firing missed
// while the machine was off happens once at boot) whose service calls the
// scheduler's FireSchedule over D-Bus, and the scheduler hands that call to
// Table.Trigger. Without systemd (quickstart, tests) the Table walks the
// same expressions on its own clock. Either way the Table decides what a
// firing does: it never lets two firings of one job overlap (the later one
// is skipped, or waits when the job says overlap = "wait"), it skips
// scheduled firings outside the job's active hours, and it keeps each
// job's last firing and its outcome for listing.
package schedules
