package calendar

import (
	"cmp"
	"time"
)

// maxSteps stops a walk that does not converge, as systemd's safety valve
// does; no valid expression needs nearly as many.
const maxSteps = 1000

// wall is a broken-down local time, the struct tm systemd walks through.
// Fields may overflow (minute 60) until normalized.
type wall struct{ year, month, day, hour, minute, sec, usec int }

// zoneClock turns wall times into instants in one zone the way glibc's
// mktime does for systemd: a wall time the clocks repeat resolves to the
// offset seen last, and one they skip moves forward by the gap.
type zoneClock struct {
	loc  *time.Location
	last int // the offset, in seconds, of the latest conversion
}

func (z *zoneClock) offsetAt(unix int64) int {
	_, off := time.Unix(unix, 0).In(z.loc).Zone()
	return off
}

// instant is the Unix second of w's wall time (sub-second ignored).
func (z *zoneClock) instant(w wall) int64 {
	local := time.Date(w.year, time.Month(w.month), w.day, w.hour, w.minute, w.sec, 0, time.UTC).Unix()
	t := local - int64(z.last)
	seen := []int64{t}
	for range 8 {
		next := local - int64(z.offsetAt(t))
		if next == t {
			z.last = int(local - t)
			return t
		}
		t = next
		for _, s := range seen {
			if s == t { // oscillating: the clocks skip this wall time
				a, b := seen[len(seen)-1], t
				t = max(a, b)
				if da, db := time.Unix(a, 0).In(z.loc).IsDST(), time.Unix(b, 0).In(z.loc).IsDST(); da != db {
					t = a
					if db {
						t = b
					}
				}
				z.last = z.offsetAt(t)
				return t
			}
		}
		seen = append(seen, t)
	}
	z.last = z.offsetAt(t)
	return t
}

// normalized is w as mktime leaves it: overflow carried, a skipped wall
// time moved past the gap.
func (z *zoneClock) normalized(w wall) wall {
	t := time.Unix(z.instant(w), 0).In(z.loc)
	return wall{t.Year(), int(t.Month()), t.Day(), t.Hour(), t.Minute(), t.Second(), w.usec}
}

// Next is the first time after after at which the expression elapses, in
// the expression's zone or, when it names none, in after's. ok is false
// when it never elapses again (a date in the past, February 30th).
func (s *Spec) Next(after time.Time) (next time.Time, ok bool) {
	loc := s.loc
	if loc == nil {
		loc = after.Location()
	}
	from := after.Truncate(time.Microsecond).Add(time.Microsecond).In(loc)
	_, off := from.Zone()
	z := &zoneClock{loc: loc, last: off}
	w := wall{from.Year(), int(from.Month()), from.Day(), from.Hour(), from.Minute(), from.Second(), from.Nanosecond() / 1000}
	w, ok = s.walk(z, w)
	if !ok {
		return time.Time{}, false
	}
	t := time.Unix(z.instant(w), int64(w.usec)*1000).In(loc)
	return t, true
}

// walk is systemd's find_next: match each field from the year down, and
// when one cannot match, carry into the field above and start again.
func (s *Spec) walk(z *zoneClock, c wall) (wall, bool) {
	for range maxSteps {
		c = z.normalized(c)

		r := s.match(s.year, c, &c.year, false)
		if r > 0 {
			c.month, c.day, c.hour, c.minute, c.sec, c.usec = 1, 1, 0, 0, 0, 0
		}
		if r < 0 || s.withinBounds(z, &c) <= 0 {
			return wall{}, false
		}

		r = s.match(s.month, c, &c.month, false)
		if r > 0 {
			c.day, c.hour, c.minute, c.sec, c.usec = 1, 0, 0, 0, 0
		}
		if r < 0 {
			c.year, c.month, c.day, c.hour, c.minute, c.sec, c.usec = c.year+1, 1, 1, 0, 0, 0, 0
			continue
		}
		if b := s.withinBounds(z, &c); b < 0 {
			c.year, c.month, c.day, c.hour, c.minute, c.sec, c.usec = c.year+1, 1, 1, 0, 0, 0, 0
			continue
		} else if b == 0 {
			continue
		}

		r = s.match(s.day, c, &c.day, s.endOfMonth)
		if r > 0 {
			c.hour, c.minute, c.sec, c.usec = 0, 0, 0, 0
		}
		if r < 0 {
			c.month, c.day, c.hour, c.minute, c.sec, c.usec = c.month+1, 1, 0, 0, 0, 0
			continue
		}
		if b := s.withinBounds(z, &c); b < 0 {
			c.month, c.day, c.hour, c.minute, c.sec, c.usec = c.month+1, 1, 0, 0, 0, 0
			continue
		} else if b == 0 {
			continue
		}

		if !s.matchesWeekday(z, c) {
			c.day, c.hour, c.minute, c.sec, c.usec = c.day+1, 0, 0, 0, 0
			continue
		}

		r = s.match(s.hour, c, &c.hour, false)
		if r > 0 {
			c.minute, c.sec, c.usec = 0, 0, 0
		}
		if r < 0 {
			c.day, c.hour, c.minute, c.sec, c.usec = c.day+1, 0, 0, 0, 0
			continue
		}
		if b := s.withinBounds(z, &c); b < 0 {
			c.day, c.hour, c.minute, c.sec, c.usec = c.day+1, 0, 0, 0, 0
			continue
		} else if b == 0 {
			continue // the hour was skipped by a zone change: start from where it led
		}

		r = s.match(s.minute, c, &c.minute, false)
		if r > 0 {
			c.sec, c.usec = 0, 0
		}
		if r < 0 {
			c.hour, c.minute, c.sec, c.usec = c.hour+1, 0, 0, 0
			continue
		}
		if b := s.withinBounds(z, &c); b < 0 {
			c.hour, c.minute, c.sec, c.usec = c.hour+1, 0, 0, 0
			continue
		} else if b == 0 {
			continue
		}

		us := c.sec*usecPerSec + c.usec
		r = s.match(s.usec, c, &us, false)
		c.sec, c.usec = us/usecPerSec, us%usecPerSec
		if r < 0 {
			c.minute, c.sec, c.usec = c.minute+1, 0, 0
			continue
		}
		if b := s.withinBounds(z, &c); b < 0 {
			c.minute, c.sec, c.usec = c.minute+1, 0, 0
			continue
		} else if b == 0 {
			continue
		}
		return c, true
	}
	return wall{}, false
}

// match moves *val to the earliest value of ch at or after it: 0 when it
// already matched, 1 when it moved, -1 when nothing in ch is left.
func (s *Spec) match(ch chain, c wall, val *int, endOfMonth bool) int {
	if ch == nil {
		return 0
	}
	best, found := 0, false
	for _, e := range ch {
		start, stop := e.start, e.stop
		if endOfMonth {
			start, stop = fromMonthEnd(c, e.start), fromMonthEnd(c, e.stop)
			if stop > 0 {
				start, stop = stop, start
			}
		}
		if start >= *val {
			if !found || start < best {
				best, found = start, true
			}
		} else if e.repeat > 0 {
			k := start + e.repeat*((*val-start+e.repeat-1)/e.repeat)
			if (!found || k < best) && (stop < 0 || k <= stop) {
				best, found = k, true
			}
		}
	}
	if !found {
		return -1
	}
	moved := 0
	if *val != best {
		moved = 1
	}
	*val = best
	return moved
}

// fromMonthEnd is the day of c's month that is n days back from its end
// (~1 is the last day), or -1 when there is none.
func fromMonthEnd(c wall, n int) int {
	first := time.Date(c.year, time.Month(c.month)+1, 1-n, 0, 0, 0, 0, time.UTC)
	want := time.Date(c.year, time.Month(c.month), 1, 0, 0, 0, 0, time.UTC)
	if first.Month() != want.Month() {
		return -1
	}
	return first.Day()
}

// withinBounds is 1 when c is a wall time that exists as written, 0 when
// normalizing moved it forward (c now holds where it led, the field below
// the first changed one reset), -1 when it is past the last year or
// normalizing would move it backwards.
func (s *Spec) withinBounds(z *zoneClock, c *wall) int {
	if c.year > maxYear {
		return -1
	}
	t := z.normalized(*c)
	order := 0
	switch {
	case t.year != c.year:
		order, t.month = cmp.Compare(t.year, c.year), 1
	case t.month != c.month:
		order, t.day = cmp.Compare(t.month, c.month), 1
	case t.day != c.day:
		order, t.hour = cmp.Compare(t.day, c.day), 0
	case t.hour != c.hour:
		order, t.minute = cmp.Compare(t.hour, c.hour), 0
	case t.minute != c.minute:
		order, t.sec = cmp.Compare(t.minute, c.minute), 0
	default:
		order = cmp.Compare(t.sec, c.sec)
	}
	switch {
	case order < 0:
		return -1
	case order > 0:
		*c = t
		return 0
	}
	return 1
}

func (s *Spec) matchesWeekday(z *zoneClock, c wall) bool {
	if s.weekdays == 0 {
		return true
	}
	d := time.Unix(z.instant(c), 0).In(z.loc).Weekday()
	monday0 := (int(d) + 6) % 7
	return s.weekdays&(1<<monday0) != 0
}
