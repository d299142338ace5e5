package calendar

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	minYear = 1970
	maxYear = 2199

	usecPerSec = 1_000_000
	allDays    = 0x7f

	// maxChain bounds a component's list, as systemd does, so a hostile
	// expression cannot build a huge one.
	maxChain = 240
)

// component is one element of a list: start, or start..stop, each with an
// optional /repeat. stop is -1 when there is no range.
type component struct{ start, stop, repeat int }

// chain is a component's list; nil means * (any value).
type chain []component

// Spec is a parsed calendar expression; it does not change once parsed,
// so one Spec may serve many goroutines.
type Spec struct {
	weekdays   uint8 // bit 0 is Monday; 0 means any day
	year       chain
	month      chain
	day        chain
	endOfMonth bool // day counts back from the month's last day (~)
	hour       chain
	minute     chain
	usec       chain // the seconds, in microseconds; never nil
	utc        bool
	zone       string // IANA name, "" when none (or UTC)
	loc        *time.Location
}

// Parse reads a systemd calendar expression.
func Parse(expr string) (*Spec, error) {
	s, err := parse(expr)
	if err != nil {
		return nil, fmt.Errorf("cannot parse calendar expression %q: %w", expr, err)
	}
	return s, nil
}

// MustParse is Parse for expressions written in code.
func MustParse(expr string) *Spec {
	s, err := Parse(expr)
	if err != nil {
		panic(err)
	}
	return s
}

// reason is why an expression is refused, said as a sentence's second half.
type reason string

func (r reason) Error() string { return string(r) }

func refuse(format string, args ...any) error { return reason(fmt.Sprintf(format, args...)) }

var shorthands = map[string]string{
	"minutely":      "*-*-* *:*:00",
	"hourly":        "*-*-* *:00:00",
	"daily":         "*-*-* 00:00:00",
	"monthly":       "*-*-01 00:00:00",
	"weekly":        "Mon *-*-* 00:00:00",
	"yearly":        "*-01-01 00:00:00",
	"annually":      "*-01-01 00:00:00",
	"anually":       "*-01-01 00:00:00",
	"quarterly":     "*-01,04,07,10-01 00:00:00",
	"semiannually":  "*-01,07-01 00:00:00",
	"semi-annually": "*-01,07-01 00:00:00",
	"biannually":    "*-01,07-01 00:00:00",
	"bi-annually":   "*-01,07-01 00:00:00",
}

func parse(expr string) (*Spec, error) {
	s := &Spec{}
	p := expr
	var unknownZone string
	if len(p) > 4 && strings.EqualFold(p[len(p)-4:], " UTC") {
		s.utc = true
		p = p[:len(p)-4]
	} else if i := strings.LastIndexByte(p, ' '); i >= 0 {
		if name := p[i+1:]; isZone(name) {
			s.zone, s.loc = name, mustLoad(name)
			p = p[:i]
		} else if mayBeZone(name) {
			unknownZone = name
		}
	}
	if s.zone == "UTC" {
		s.utc, s.zone = true, ""
	}
	if s.utc {
		s.loc = time.UTC
	}
	if err := s.parseRest(p); err != nil {
		if unknownZone != "" {
			return nil, refuse("%s is not a time zone this machine knows", unknownZone)
		}
		return nil, err
	}
	return s, nil
}

func (s *Spec) parseRest(p string) error {
	if p == "" {
		return refuse("it names no time")
	}
	if long, ok := shorthands[strings.ToLower(p)]; ok {
		p = long
	}
	r := &reader{rest: p}
	if err := r.weekdays(s); err != nil {
		return err
	}
	if err := r.date(s); err != nil {
		return err
	}
	if s.usec == nil { // an @EPOCH instant sets the time too
		if err := r.time(s); err != nil {
			return err
		}
	}
	if r.rest != "" {
		return refuse("%q after the time is not part of a calendar expression", r.rest)
	}
	s.normalize()
	return s.valid()
}

// isZone says whether the last word names a time zone, as systemd asks
// the zone database; "Local" is Go's name for the machine's zone, not one.
func isZone(name string) bool {
	if name == "" || name == "Local" || strings.HasPrefix(name, "/") || name[0] >= '0' && name[0] <= '9' {
		return false
	}
	_, err := time.LoadLocation(name)
	return err == nil
}

func mustLoad(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err) // isZone loaded it a moment ago
	}
	return loc
}

// mayBeZone says whether a last word that is no time zone was meant as
// one, so the error names the zone rather than the syntax.
func mayBeZone(word string) bool {
	if word == "" || strings.ContainsAny(word, "*:~,.") || dayPrefix(strings.ToLower(word)) {
		return false
	}
	if _, ok := shorthands[strings.ToLower(word)]; ok {
		return false
	}
	return strings.IndexFunc(word, func(c rune) bool { return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' }) >= 0
}

// dayPrefix says whether a lower-case word starts with a weekday's name.
func dayPrefix(w string) bool {
	for _, d := range dayNames {
		if strings.HasPrefix(w, strings.ToLower(d.name)) {
			return true
		}
	}
	return false
}

var dayNames = []struct {
	name string
	nr   int
}{
	{"Monday", 0}, {"Mon", 0}, {"Tuesday", 1}, {"Tue", 1}, {"Wednesday", 2}, {"Wed", 2},
	{"Thursday", 3}, {"Thu", 3}, {"Friday", 4}, {"Fri", 4}, {"Saturday", 5}, {"Sat", 5},
	{"Sunday", 6}, {"Sun", 6},
}

var shortDays = [7]string{"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}

// reader walks an expression left to right, as systemd's parser does.
type reader struct{ rest string }

func (r *reader) peek() byte {
	if r.rest == "" {
		return 0
	}
	return r.rest[0]
}

func (r *reader) skipSpaces() { r.rest = strings.TrimLeft(r.rest, " ") }

func (r *reader) weekdays(s *Spec) error {
	from := -1
	first := true
	for {
		nr, n := -1, 0
		for _, d := range dayNames {
			if len(r.rest) >= len(d.name) && strings.EqualFold(r.rest[:len(d.name)], d.name) {
				nr, n = d.nr, len(d.name)
				break
			}
		}
		if nr < 0 {
			if first {
				return nil
			}
			return refuse("%q is not a weekday", word(r.rest))
		}
		if next := at(r.rest, n); next != 0 && !strings.ContainsRune("-.,  ", rune(next)) {
			return refuse("%q is not a weekday", word(r.rest))
		}
		s.weekdays |= 1 << nr
		if from >= 0 {
			if from > nr {
				return refuse("the weekday range %s..%s runs backwards", shortDays[from], shortDays[nr])
			}
			for j := from + 1; j < nr; j++ {
				s.weekdays |= 1 << j
			}
		}
		r.rest = r.rest[n:]
		switch r.peek() {
		case 0:
			return nil
		case ' ':
			r.skipSpaces()
			return nil
		case '.':
			if from >= 0 || at(r.rest, 1) != '.' {
				return refuse("a weekday range is written Mon..Fri, with two dots, and ranges do not chain")
			}
			from = nr
			r.rest = r.rest[2:]
		case '-':
			if from >= 0 {
				return refuse("a weekday range is written Mon..Fri, and ranges do not chain")
			}
			from = nr
			r.rest = r.rest[1:]
		case ',':
			from = -1
			r.rest = r.rest[1:]
		}
		if c := r.peek(); c == 0 || c == ' ' {
			r.skipSpaces()
			if from >= 0 {
				return refuse("the weekday range from %s has no end", shortDays[from])
			}
			return nil
		}
		first = false
	}
}

func at(s string, i int) byte {
	if i < len(s) {
		return s[i]
	}
	return 0
}

// word is the start of rest up to its next space, to name it in an error.
func word(rest string) string {
	if i := strings.IndexByte(rest, ' '); i >= 0 {
		return rest[:i]
	}
	return rest
}

func (r *reader) date(s *Spec) error {
	if r.rest == "" {
		return nil
	}
	if r.peek() == '@' {
		return r.instant(s)
	}
	start := r.rest
	if c := r.peek(); c != '*' && (c < '0' || c > '9') {
		return refuse("%q is not a weekday, a date or a time", word(start))
	}
	first, err := r.chain(false, "the year, month or hour")
	if err != nil {
		return err
	}
	if c := r.peek(); c == 0 || c == ':' {
		r.rest = start // it was an hour
		return nil
	}
	if !r.dateSeparator(s) {
		return refuse("%q is not a date or a time", word(start))
	}
	second, err := r.chain(false, "the month or day")
	if err != nil {
		return err
	}
	if c := r.peek(); c == 0 || c == ' ' {
		r.skipSpaces()
		s.month, s.day = first, second
		return nil
	}
	if s.endOfMonth {
		return refuse("~ separates the month from the day, so it comes last in a date")
	}
	if !r.dateSeparator(s) {
		return refuse("%q is not a date", word(start))
	}
	third, err := r.chain(false, "the day")
	if err != nil {
		return err
	}
	if c := r.peek(); c != 0 && c != ' ' {
		return refuse("%q is not a date", word(start))
	}
	r.skipSpaces()
	s.year, s.month, s.day = first, second, third
	return nil
}

// instant reads @EPOCH: that second, in UTC.
func (r *reader) instant(s *Spec) error {
	r.rest = r.rest[1:]
	n := 0
	for n < len(r.rest) && r.rest[n] >= '0' && r.rest[n] <= '9' {
		n++
	}
	v, err := strconv.ParseInt(r.rest[:n], 10, 64)
	if err != nil || v > 1<<40 {
		return refuse("@%s is not a number of seconds since 1970", word(r.rest))
	}
	r.rest = r.rest[n:]
	t := time.Unix(v, 0).UTC()
	one := func(v int) chain { return chain{{v, -1, 0}} }
	s.year, s.month, s.day = one(t.Year()), one(int(t.Month())), one(t.Day())
	s.hour, s.minute, s.usec = one(t.Hour()), one(t.Minute()), one(t.Second()*usecPerSec)
	s.utc, s.zone, s.loc = true, "", time.UTC
	return nil
}

func (r *reader) dateSeparator(s *Spec) bool {
	switch r.peek() {
	case '~':
		s.endOfMonth = true
	case '-':
	default:
		return false
	}
	r.rest = r.rest[1:]
	return true
}

func (r *reader) time(s *Spec) error {
	if r.rest == "" {
		s.hour, s.minute, s.usec = chain{{0, -1, 0}}, chain{{0, -1, 0}}, chain{{0, -1, 0}}
		return nil
	}
	start := r.rest
	h, err := r.chain(false, "the hour")
	if err != nil {
		return err
	}
	if r.peek() != ':' {
		return refuse("%q is not a time: it is written HOUR:MINUTE[:SECOND]", word(start))
	}
	r.rest = r.rest[1:]
	m, err := r.chain(false, "the minute")
	if err != nil {
		return err
	}
	s.hour, s.minute = h, m
	if r.rest == "" {
		s.usec = chain{{0, -1, 0}}
		return nil
	}
	if r.peek() != ':' {
		return refuse("%q is not a time: it is written HOUR:MINUTE[:SECOND]", word(start))
	}
	r.rest = r.rest[1:]
	sec, err := r.chain(true, "the second")
	if err != nil {
		return err
	}
	s.usec = sec
	return nil
}

// chain reads * or a comma-separated list of components.
func (r *reader) chain(usec bool, what string) (chain, error) {
	if r.peek() == '*' {
		r.rest = r.rest[1:]
		if r.peek() == '/' {
			return nil, refuse("*/N does not repeat %s: write 0/N (from 0, every N)", what)
		}
		if usec {
			return chain{{0, -1, usecPerSec}}, nil
		}
		return nil, nil
	}
	var c chain
	for {
		if len(c) > maxChain {
			return nil, refuse("the list for %s is longer than %d entries", what, maxChain)
		}
		start, err := r.number(usec, what)
		if err != nil {
			return nil, err
		}
		comp := component{start: start, stop: -1}
		if strings.HasPrefix(r.rest, "..") {
			r.rest = r.rest[2:]
			if comp.stop, err = r.number(usec, what); err != nil {
				return nil, err
			}
			comp.repeat = 1
			if usec {
				comp.repeat = usecPerSec
			}
		}
		if r.peek() == '/' {
			r.rest = r.rest[1:]
			if comp.repeat, err = r.number(usec, what); err != nil {
				return nil, err
			}
			if comp.repeat == 0 {
				return nil, refuse("the repetition of %s is 0; it must be at least 1", what)
			}
		} else if usec && comp.stop >= 0 && comp.start+comp.repeat > comp.stop {
			return nil, refuse("the range of seconds %s is shorter than a second", formatComponent(comp, 2, true))
		}
		if c := r.peek(); c != 0 && !strings.ContainsRune(" ,-~:", rune(c)) {
			return nil, refuse("%q in %s is not a number, range or repetition", word(r.rest), what)
		}
		c = append(c, comp)
		if r.peek() != ',' {
			return c, nil
		}
		r.rest = r.rest[1:]
	}
}

// number reads a decimal; seconds (usec) may have up to six decimals.
func (r *reader) number(usec bool, what string) (int, error) {
	n := 0
	for n < len(r.rest) && r.rest[n] >= '0' && r.rest[n] <= '9' {
		n++
	}
	if n == 0 {
		return 0, refuse("%q is not a number for %s", word(r.rest), what)
	}
	v, err := strconv.ParseUint(r.rest[:n], 10, 31)
	if err != nil {
		return 0, refuse("%s is too large for %s", r.rest[:n], what)
	}
	r.rest = r.rest[n:]
	if !usec {
		return int(v), nil
	}
	if v > (1<<31-1)/usecPerSec {
		return 0, refuse("%d is too large for %s", v, what)
	}
	value := int(v) * usecPerSec
	if r.peek() == '.' && at(r.rest, 1) != '.' {
		r.rest = r.rest[1:]
		d := 0
		for d < len(r.rest) && r.rest[d] >= '0' && r.rest[d] <= '9' {
			d++
		}
		frac := r.rest[:d]
		r.rest = r.rest[d:]
		frac = (frac + "000000")[:6]
		f, _ := strconv.Atoi(frac)
		value += f
	}
	return value, nil
}

func (s *Spec) normalize() {
	if s.weekdays == allDays {
		s.weekdays = 0
	}
	if s.endOfMonth && s.day == nil {
		s.endOfMonth = false
	}
	for i := range s.year {
		s.year[i].start = fullYear(s.year[i].start)
		s.year[i].stop = fullYear(s.year[i].stop)
	}
	for _, c := range []*chain{&s.year, &s.month, &s.day, &s.hour, &s.minute, &s.usec} {
		*c = normalizeChain(*c)
	}
}

// fullYear reads two-digit years as systemd does: 12 is 2012, 89 is 1989.
func fullYear(y int) int {
	switch {
	case y >= 0 && y < 70:
		return y + 2000
	case y >= 70 && y < 100:
		return y + 1900
	}
	return y
}

func normalizeChain(c chain) chain {
	if c == nil {
		return nil
	}
	for i := range c {
		e := &c[i]
		if e.stop > e.start && e.repeat > 0 {
			e.stop -= (e.stop - e.start) % e.repeat
		}
		if e.stop > e.start && e.repeat > 0 && e.start+e.repeat > e.stop || e.start == e.stop {
			e.repeat, e.stop = 0, -1
		}
	}
	slices.SortFunc(c, func(a, b component) int {
		if a.start != b.start {
			return a.start - b.start
		}
		if a.stop != b.stop {
			return a.stop - b.stop
		}
		return a.repeat - b.repeat
	})
	return slices.Compact(c)
}

func (s *Spec) valid() error {
	checks := []struct {
		c        chain
		from, to int
		eom      bool
		what     string
	}{
		{s.year, minYear, maxYear, false, "year"},
		{s.month, 1, 12, false, "month"},
		{s.day, 1, 31, s.endOfMonth, "day"},
		{s.hour, 0, 23, false, "hour"},
		{s.minute, 0, 59, false, "minute"},
		{s.usec, 0, 60*usecPerSec - 1, false, "second"},
	}
	for _, k := range checks {
		if err := validChain(k.c, k.from, k.to, k.eom, k.what, k.what == "second"); err != nil {
			return err
		}
	}
	return nil
}

func validChain(c chain, from, to int, endOfMonth bool, what string, usec bool) error {
	if endOfMonth {
		to -= 3 // at most 28 days back from the month's end
	}
	show := func(v int) string {
		if usec {
			return formatValue(v, 2, true)
		}
		return strconv.Itoa(v)
	}
	span := show(from) + ".." + show(to)
	if endOfMonth {
		span = "~" + show(from) + "..~" + show(to)
	}
	for _, e := range c {
		if e.start < from || e.start > to {
			return refuse("the %s %s is outside %s", what, show(e.start), span)
		}
		if e.repeat > to-from {
			return refuse("the %s's repetition /%s is longer than %s", what, show(e.repeat), span)
		}
		if e.stop >= 0 {
			if e.stop < from || e.stop > to {
				return refuse("the %s %s is outside %s", what, show(e.stop), span)
			}
			if e.start+e.repeat > e.stop {
				return refuse("the %s range %s..%s does not repeat even once", what, show(e.start), show(e.stop))
			}
			continue
		}
		if endOfMonth && e.start-e.repeat < from || !endOfMonth && e.start+e.repeat > to {
			return refuse("the %s %s repeated every %s leaves %s", what, show(e.start), show(e.repeat), span)
		}
	}
	return nil
}

// Location is the time zone the expression names, or nil when it names
// none and so follows the zone of the time passed to Next.
func (s *Spec) Location() *time.Location { return s.loc }

// String is the normalized form, as `systemd-analyze calendar` prints it.
func (s *Spec) String() string {
	var b strings.Builder
	if s.weekdays != 0 {
		b.WriteString(formatWeekdays(s.weekdays))
		b.WriteByte(' ')
	}
	b.WriteString(formatChain(s.year, 4, false))
	b.WriteByte('-')
	b.WriteString(formatChain(s.month, 2, false))
	if s.endOfMonth {
		b.WriteByte('~')
	} else {
		b.WriteByte('-')
	}
	b.WriteString(formatChain(s.day, 2, false))
	b.WriteByte(' ')
	b.WriteString(formatChain(s.hour, 2, false))
	b.WriteByte(':')
	b.WriteString(formatChain(s.minute, 2, false))
	b.WriteByte(':')
	b.WriteString(formatChain(s.usec, 2, true))
	switch {
	case s.utc:
		b.WriteString(" UTC")
	case s.zone != "":
		b.WriteString(" " + s.zone)
	}
	return b.String()
}

func formatWeekdays(bits uint8) string {
	var b strings.Builder
	l := -1
	comma := false
	closeRun := func(x int) {
		if x > l+1 {
			if x > l+2 {
				b.WriteString("..")
			} else {
				b.WriteString(",")
			}
			b.WriteString(shortDays[x-1])
		}
	}
	for x := range 7 {
		if bits&(1<<x) != 0 {
			if l < 0 {
				if comma {
					b.WriteByte(',')
				}
				comma = true
				b.WriteString(shortDays[x])
				l = x
			}
		} else if l >= 0 {
			closeRun(x)
			l = -1
		}
	}
	if l >= 0 {
		closeRun(7)
	}
	return b.String()
}

func formatChain(c chain, width int, usec bool) string {
	if c == nil {
		return "*"
	}
	if usec && len(c) == 1 && c[0].start == 0 && c[0].repeat == usecPerSec {
		return "*"
	}
	parts := make([]string, len(c))
	for i, e := range c {
		parts[i] = formatComponent(e, width, usec)
	}
	return strings.Join(parts, ",")
}

func formatComponent(e component, width int, usec bool) string {
	unit := 1
	if usec {
		unit = usecPerSec
	}
	s := formatValue(e.start, width, usec)
	if e.stop > 0 {
		s += ".." + formatValue(e.stop, width, usec)
	}
	if e.repeat > 0 && !(e.stop > 0 && e.repeat == unit) {
		s += "/" + strings.TrimLeft(formatValue(e.repeat, 1, usec), " ")
	}
	return s
}

func formatValue(v, width int, usec bool) string {
	if !usec {
		return fmt.Sprintf("%0*d", width, v)
	}
	s := fmt.Sprintf("%0*d", width, v/usecPerSec)
	if f := v % usecPerSec; f > 0 {
		s += fmt.Sprintf(".%06d", f)
	}
	return s
}
