package calendar_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/calendar"
	"github.com/berth-dev/berth/internal/testkit/testenv"
)

// oracle is what `systemd-analyze calendar` says of an expression: its
// normalized form and the next elapses from base, or that it refused it.
type oracle struct {
	refused    bool
	normalized string
	elapses    []time.Time // empty: never
}

// ask runs systemd-analyze in the zone tz (the machine's local zone as it
// sees it) from base, for n elapses.
func ask(t *testing.T, tz, expr string, base time.Time, n int) oracle {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "systemd-analyze", "calendar",
		fmt.Sprintf("--base-time=@%d", base.Unix()), fmt.Sprintf("--iterations=%d", n), "--", expr)
	cmd.Env = append(os.Environ(), "TZ="+tz, "LC_ALL=C", "SYSTEMD_COLORS=0")
	out, err := cmd.CombinedOutput()
	if strings.Contains(string(out), "Failed to parse calendar specification") {
		return oracle{refused: true}
	}
	if err != nil {
		t.Fatalf("systemd-analyze calendar %q: %v\n%s", expr, err, out)
	}
	var o oracle
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		key, value, ok := strings.Cut(strings.TrimSpace(sc.Text()), ": ")
		if !ok {
			continue
		}
		switch {
		case key == "Normalized form":
			o.normalized = value
		case key == "Next elapse" && value == "never":
		case key == "Next elapse" || key == "(in UTC)" || strings.HasPrefix(key, "Iter. #"):
			if !strings.HasSuffix(value, " UTC") {
				continue // the local form; its "(in UTC)" line follows
			}
			at, err := time.Parse("Mon 2006-01-02 15:04:05 MST", value)
			if err != nil {
				t.Fatalf("cannot read systemd-analyze's %q: %v", value, err)
			}
			o.elapses = append(o.elapses, at.UTC())
		}
	}
	return o
}

func needSystemdAnalyze(t *testing.T) {
	t.Helper()
	_, err := exec.LookPath("systemd-analyze")
	testenv.Need(t, err == nil, "systemd-analyze is not installed")
}

func utc(s string) time.Time {
	t, err := time.Parse(time.DateTime, s)
	if err != nil {
		panic(err)
	}
	return t
}

// The expressions below, each from a base time and for a few elapses,
// must read and elapse exactly as systemd reads and elapses them.
func TestExpressionsElapseAsSystemdSays(t *testing.T) {
	t.Parallel()
	needSystemdAnalyze(t)
	const late2025 = "2025-11-24 16:00:00"
	cases := []struct {
		expr string
		base string
		tz   string // the machine's zone; UTC unless said
		n    int
		says string // for one systemd refuses: what berth's error says is wrong
	}{
		// shorthands
		{expr: "minutely", base: late2025, n: 3},
		{expr: "hourly", base: late2025, n: 3},
		{expr: "daily", base: late2025, n: 3},
		{expr: "weekly", base: late2025, n: 3},
		{expr: "monthly", base: late2025, n: 3},
		{expr: "yearly", base: late2025, n: 2},
		{expr: "annually", base: late2025, n: 2},
		{expr: "quarterly", base: late2025, n: 5},
		{expr: "semiannually", base: late2025, n: 3},
		{expr: "Semi-Annually", base: late2025, n: 3},
		{expr: "weekly utc", base: late2025, n: 2},
		{expr: "daily Europe/Berlin", base: late2025, n: 2},
		// weekdays
		{expr: "Mon..Fri 09:00", base: late2025, n: 8},
		{expr: "Mon..Fri 09:00 Europe/Berlin", base: late2025, n: 6},
		{expr: "mon,wed *-*-* 1,3:00", base: late2025, n: 5},
		{expr: "Mon,Tue,Wed,Fri 9:00", base: late2025, n: 5},
		{expr: "Sat,Sun 10:30", base: late2025, n: 4},
		{expr: "Mon-Wed", base: late2025, n: 4},
		{expr: "Monday..Sunday", base: late2025, n: 2},
		{expr: "Fri,Mon..Tue 12:00", base: late2025, n: 4},
		{expr: "Thu,", base: late2025, n: 2},
		{expr: "Fri *-*-13 00:00", base: late2025, n: 3},
		// dates
		{expr: "12-25", base: late2025, n: 2},
		{expr: "2026-01-01", base: late2025, n: 2},
		{expr: "26-01-01", base: late2025, n: 1},
		{expr: "2026..2028-02-29", base: late2025, n: 2},
		{expr: "*-*-1/3", base: late2025, n: 6},
		{expr: "*-*-01,15 08:00", base: late2025, n: 4},
		{expr: "2025/2-01-01", base: late2025, n: 3},
		{expr: "*-1..3,10-01", base: late2025, n: 5},
		{expr: "*-02-29", base: late2025, n: 2},
		{expr: "2026-02-30", base: late2025, n: 1},
		{expr: "@1700000000", base: late2025, n: 1},
		{expr: "*-*-31", base: late2025, n: 4},
		// from the end of the month
		{expr: "*-*~01", base: late2025, n: 4},
		{expr: "*-02~03", base: late2025, n: 2},
		{expr: "*-05~07/1", base: late2025, n: 3},
		{expr: "*-*~1..3 12:00", base: late2025, n: 4},
		{expr: "*-*~7/2", base: late2025, n: 5},
		// times
		{expr: "09:00", base: late2025, n: 2},
		{expr: "*:0/15", base: late2025, n: 5},
		{expr: "*:*:0/20", base: late2025, n: 4},
		{expr: "1..10/3:00", base: late2025, n: 5},
		{expr: "8..18:00", base: late2025, n: 4},
		{expr: "*:5..5", base: late2025, n: 2},
		{expr: "00:00:01.5", base: late2025, n: 2},
		{expr: "*:*:0..30/10.5", base: late2025, n: 4},
		{expr: "*-*-* 23:59:59", base: late2025, n: 2},
		{expr: "12:00:00 UTC", base: late2025, n: 2},
		{expr: "*:3,1,2,2", base: late2025, n: 4},
		{expr: "Mon *-*-* 12:0/30 Asia/Kolkata", base: late2025, n: 3},
		{expr: "*-*-* 09:00 America/New_York", base: "2026-03-07 12:00:00", n: 3},
		// daylight saving in Europe/Berlin: 2026-03-29 02:00 skips to 03:00,
		// 2026-10-25 03:00 falls back to 02:00
		{expr: "*-*-* 02:30 Europe/Berlin", base: "2026-03-28 23:00:00", n: 3},
		{expr: "*:30 Europe/Berlin", base: "2026-03-28 23:00:00", n: 5},
		{expr: "hourly Europe/Berlin", base: "2026-03-28 23:00:00", n: 5},
		{expr: "*-*-* 02:*:00/20 Europe/Berlin", base: "2026-03-28 23:00:00", n: 3},
		{expr: "*-03-29 02..03:00 Europe/Berlin", base: "2026-03-28 23:00:00", n: 2},
		{expr: "*-10-25 02:30 Europe/Berlin", base: "2026-10-24 23:00:00", n: 3},
		{expr: "hourly Europe/Berlin", base: "2026-10-24 23:00:00", n: 5},
		{expr: "*:45 Europe/Berlin", base: "2026-10-25 00:10:00", n: 3},
		{expr: "*:45 Europe/Berlin", base: "2026-10-25 01:10:00", n: 3},
		{expr: "*:*:00/20 Europe/Berlin", base: "2026-10-25 00:59:00", n: 6},
		{expr: "daily Europe/Berlin", base: "2026-10-24 12:00:00", n: 3},
		// zones by other names, odd offsets, a skipped day, half-hour DST
		{expr: "daily Etc/UTC", base: late2025, n: 2},
		{expr: "daily Zulu", base: late2025, n: 2},
		{expr: "09:00 America/Argentina/Buenos_Aires", base: late2025, n: 2},
		{expr: "Mon 09:00 Pacific/Chatham", base: late2025, n: 2},
		{expr: "*-*-* 00:30 Pacific/Apia", base: "2011-12-29 00:00:00", n: 3},
		{expr: "*-*-* 02:15 Australia/Lord_Howe", base: "2026-10-03 00:00:00", n: 3},
		{expr: "hourly Australia/Lord_Howe", base: "2026-04-04 13:00:00", n: 4},
		// the machine's own zone
		{expr: "*-*-* 02:30", tz: "Europe/Berlin", base: "2026-03-28 23:00:00", n: 3},
		{expr: "hourly", tz: "Europe/Berlin", base: "2026-10-24 23:00:00", n: 5},
		{expr: "Mon..Fri 09:00", tz: "Europe/Berlin", base: late2025, n: 3},
		// refused
		{expr: "", base: late2025, n: 1, says: `it names no time`},
		{expr: "foo", base: late2025, n: 1, says: `"foo" is not a weekday, a date or a time`},
		{expr: "Sat..Mon", base: late2025, n: 1, says: `the weekday range Sat..Mon runs backwards`},
		{expr: "mon..", base: late2025, n: 1, says: `the weekday range from Mon has no end`},
		{expr: "Mon..Tue..Wed", base: late2025, n: 1, says: `ranges do not chain`},
		{expr: "Mond 09:00", base: late2025, n: 1, says: `"Mond" is not a weekday`},
		{expr: "*-*-* 24:00", base: late2025, n: 1, says: `the hour 24 is outside 0..23`},
		{expr: "*:00:60", base: late2025, n: 1, says: `the second 60 is outside 00..59.999999`},
		{expr: "*:60", base: late2025, n: 1, says: `the minute 60 is outside 0..59`},
		{expr: "*-13-01", base: late2025, n: 1, says: `the month 13 is outside 1..12`},
		{expr: "*-*-32", base: late2025, n: 1, says: `the day 32 is outside 1..31`},
		{expr: "*-*~29", base: late2025, n: 1, says: `the day 29 is outside ~1..~28`},
		{expr: "2200-01-01", base: late2025, n: 1, says: `the year 2200 is outside 1970..2199`},
		{expr: "1969-01-01", base: late2025, n: 1, says: `the year 1969 is outside 1970..2199`},
		{expr: "0/0:00", base: late2025, n: 1, says: `is 0; it must be at least 1`},
		{expr: "*/5", base: late2025, n: 1, says: `write 0/N (from 0, every N)`},
		{expr: "*:*/15", base: late2025, n: 1, says: `*/N does not repeat the minute`},
		{expr: "09:00 ", base: late2025, n: 1, says: `it is written HOUR:MINUTE[:SECOND]`},
		{expr: "2026-01-01 00:00 Europe/Nowhere", base: late2025, n: 1, says: `Europe/Nowhere is not a time zone this machine knows`},
		{expr: "09", base: late2025, n: 1, says: `"09" is not a time`},
		{expr: "09:00:00:00", base: late2025, n: 1, says: `":00" after the time is not part of a calendar expression`},
		{expr: "*-*~01-01", base: late2025, n: 1, says: `is not a date`},
		{expr: "1..x:00", base: late2025, n: 1, says: `"x:00" is not a number`},
		{expr: "*:*:1..1.5", base: late2025, n: 1, says: `is shorter than a second`},
		{expr: "daily Local", base: late2025, n: 1, says: `Local is not a time zone`},
	}
	for _, c := range cases {
		tz := c.tz
		if tz == "" {
			tz = "UTC"
		}
		t.Run(fmt.Sprintf("%q_in_%s_from_%s", c.expr, tz, c.base), func(t *testing.T) {
			t.Parallel()
			base := utc(c.base)
			want := ask(t, tz, c.expr, base, c.n)
			spec, err := calendar.Parse(c.expr)
			if want.refused {
				if c.says == "" {
					t.Fatalf("systemd refuses %q: the case must say what berth's error says", c.expr)
				}
				if err == nil {
					t.Fatalf("Parse(%q) = %s; systemd refuses it", c.expr, spec)
				}
				msg := err.Error()
				if !strings.HasPrefix(msg, fmt.Sprintf("cannot parse calendar expression %q: ", c.expr)) || !strings.Contains(msg, c.says) {
					t.Errorf("the error %q does not say %q", msg, c.says)
				}
				return
			}
			if err != nil {
				t.Fatalf("systemd reads %q as %q, Parse refused it: %v", c.expr, want.normalized, err)
			}
			if got := spec.String(); got != want.normalized {
				t.Errorf("normalized form %q, systemd's %q", got, want.normalized)
			}
			zone, err := time.LoadLocation(tz)
			if err != nil {
				t.Fatal(err)
			}
			var got []time.Time
			at := base.In(zone)
			for range c.n {
				next, ok := spec.Next(at)
				if !ok {
					break
				}
				if !next.After(at) {
					t.Fatalf("Next(%s) = %s, not after it", at, next)
				}
				got = append(got, next.UTC().Truncate(time.Second))
				at = next
			}
			if fmt.Sprint(got) != fmt.Sprint(want.elapses) {
				t.Errorf("elapses\n got %v\nwant %v", got, want.elapses)
			}
		})
	}
}
