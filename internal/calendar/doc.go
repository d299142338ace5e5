// Package calendar reads systemd calendar expressions (systemd.time(7),
// the OnCalendar= of a .timer) and computes when one next elapses, so a
// scheduled job fires at the same instants whether systemd's timer or
// berth's own loop drives it.
//
// Parse accepts what systemd 252 accepts and nothing else: weekdays
// (Mon..Fri, lists, the old Mon-Wed ranges), dates ([YEAR-]MONTH-DAY, with
// ~ counting days from the end of the month), times (HOUR:MINUTE[:SECOND],
// seconds with up to six decimals), *, lists, ranges and /repetitions in
// every component, the shorthands (minutely … semiannually), and a time
// zone at the end: UTC or an IANA name such as Europe/Berlin, and @EPOCH
// for one instant. One difference: systemd reads the machine's own zone
// abbreviation (CET where TZ is Europe/Berlin) as "this zone, standard
// time"; Parse reads it as the zone database's zone of that name, or
// refuses it when there is none (CEST). Name the zone (Europe/Berlin).
//
// Spec.String is systemd's normalized form, and Spec.Next follows systemd's
// walk through local time, including its choices in daylight saving
// changes: a wall time the clocks skip does not elapse that day, and a wall
// time the clocks repeat elapses once. The tests hold both against
// `systemd-analyze calendar`.
package calendar
