package broker

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // CRON_TZ= names a zone, which a machine without a zoneinfo database must find too
	"unicode"

	"github.com/robfig/cron/v3"

	"github.com/natstone/natstone/subjects"
)

// maxCronLen bounds a cron expression, zone included.
const maxCronLen = 256

// cronParser reads the five fields of standard cron (minute hour day-of-month month day-of-week),
// the descriptors (@hourly, @daily, @every 90s…) and a leading CRON_TZ=<zone>.
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseCron parses spec, refusing what would not fire as written: an empty spec or one over
// maxCronLen, white space around it or other than spaces in it, an empty zone, a zone without an
// expression, CRON_TZ=Local (the machine's
// zone: a cron without a zone is in UTC), an "@every" shorter than subjects.MinScheduleEvery or
// not in whole seconds (the cron library would round it), a field with an empty list element or a
// sign (",1", "+1": the library reads them as "1"), a range from a star ("*-5": the library reads
// it as "*"), and an expression with no time within
// maxFirstFire of now (such as February 30).
//
// Day of month and day of week combine as in Vixie cron (cronie, the crontab of most systems): a
// day matches both when either field begins with "*", and either of them otherwise. The library
// takes "*/2" as a list of days, which either field then matches alone.
func parseCron(spec string, now time.Time) (s cron.Schedule, err error) {
	if spec == "" {
		return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron is required")
	}
	if strings.TrimSpace(spec) != spec {
		return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q begins or ends with white space", spec)
	}
	if len(spec) > maxCronLen {
		return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron of %d bytes, at most %d", len(spec), maxCronLen)
	}
	if strings.ContainsFunc(spec, func(r rune) bool { return r != ' ' && unicode.IsSpace(r) }) {
		// The library splits at any white space (and the fields below are split as it does), the
		// zone is cut at a space, and @every's check reads what follows "@every ": one rule for all.
		return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q: its fields are separated by spaces, not by other white space", spec)
	}
	zone, expr, zoned := subjects.CronZone(spec)
	switch {
	case zoned && zone == "":
		return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q: CRON_TZ= names no zone (leave it out for UTC)", spec)
	case zoned && expr == "":
		return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q: a zone without an expression", spec)
	case zoned && zone == "Local":
		return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q: CRON_TZ=Local names the broker's zone, not one", spec)
	case !zoned:
		zone = "UTC" // no zone: UTC, as documented, not the machine's time.Local
	}
	defer func() {
		if r := recover(); r != nil { // the library has panicked on malformed zones
			s, err = nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q is not a cron expression", spec)
		}
	}()
	fields := strings.Fields(expr)
	if !strings.HasPrefix(expr, "@") {
		for _, f := range fields {
			for elem := range strings.SplitSeq(f, ",") {
				if elem == "" || strings.Contains(elem, "+") {
					return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q: field %q has an empty list element or a sign", spec, f)
				}
				if r, _, _ := strings.Cut(elem, "/"); len(r) > 1 && starred(r) {
					return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q: field %q has a range from %q (%q is every value already)", spec, f, r[:1], r[:1])
				}
			}
		}
	}
	if len(fields) == 5 {
		if fields[4], err = sundaySeven(fields[4]); err != nil {
			return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q: %v", spec, err)
		}
	}
	// Fields may be apart by more than one space, as in a crontab; the library's "@every" reads
	// what follows its first space as the duration.
	full := "CRON_TZ=" + zone + " " + strings.Join(fields, " ")
	if s, err = cronParser.Parse(full); err != nil {
		return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q: %v", spec, err)
	}
	if ss, ok := s.(*cron.SpecSchedule); ok {
		if len(fields) == 5 { // minute hour day-of-month month day-of-week
			// The library marks a field with a star anywhere in it ("13,*"); Vixie cron, one that
			// begins with one.
			ss.Dom &^= cronStar
			ss.Dow &^= cronStar
			if starred(fields[2]) {
				ss.Dom |= cronStar
			}
			if starred(fields[4]) {
				ss.Dow |= cronStar
			}
		}
		s = wallCron{minute: ss.Minute, hour: ss.Hour, dom: ss.Dom, month: ss.Month, dow: ss.Dow, loc: ss.Location}
	}
	if every, ok := strings.CutPrefix(expr, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(every))
		if err != nil || d < subjects.MinScheduleEvery || d%time.Second != 0 {
			return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q: @every takes a whole number of seconds, at least %v", spec, subjects.MinScheduleEvery)
		}
	}
	if n := s.Next(now); n.IsZero() || n.Sub(now) > maxFirstFire {
		return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q does not fire within 5 years (%v)", spec, maxFirstFire)
	}
	return s, nil
}

// sundaySeven rewrites the 7s of a day-of-week field, Sunday in Vixie cron as 0 is, into what the
// cron library reads (0 to 6): "7" is "0", and a range or a step that reaches 7 ("5-7", "1-7/3",
// "7/2") is listed day by day ("5,6,0"). A number past 7 is refused here, where the library's
// error would say 6 is the most; other elements, and any it cannot read, are left to the library
// (and its errors).
func sundaySeven(field string) (string, error) {
	elems := strings.Split(field, ",")
	for i, elem := range elems {
		r, step, stepped := strings.Cut(elem, "/")
		lo, hi, ranged := strings.Cut(r, "-")
		for _, b := range []string{lo, hi} {
			if n, err := strconv.Atoi(b); err == nil && n > 7 {
				return "", fmt.Errorf("day of week %s: from 0 to 7 (0 and 7 are Sunday), or SUN to SAT", b)
			}
		}
		if seven := func(d string) bool { n, ok := weekday(d); return ok && n == 7 }; !seven(lo) && !seven(hi) {
			continue
		}
		from, ok := weekday(lo)
		to := from
		if ranged {
			var okTo bool
			to, okTo = weekday(hi)
			ok = ok && okTo
		} else if stepped {
			to = 7 // "N/step" is N to the end of the range, in the library as in cronie
		}
		by := 1
		if stepped {
			n, err := strconv.Atoi(step)
			if err != nil || n < 1 {
				continue
			}
			by = n
		}
		if !ok || from > to {
			continue
		}
		var days []string
		for d := from; d <= to; d += by {
			days = append(days, strconv.Itoa(d%7))
		}
		elems[i] = strings.Join(days, ",")
	}
	return strings.Join(elems, ","), nil
}

// weekday reads a day of week as a number from 0 to 7 (in decimal digits: "07" too, as the cron
// library reads "05") or a name from SUN to SAT, of any case.
func weekday(s string) (int, bool) {
	if s != "" && s[0] >= '0' && s[0] <= '9' {
		n, err := strconv.Atoi(s)
		return n, err == nil && n <= 7
	}
	for d := time.Sunday; d <= time.Saturday; d++ {
		if strings.EqualFold(s, d.String()[:3]) {
			return int(d), true
		}
	}
	return 0, false
}

// starred reports whether a cron field or list element begins with a star: "*", or "?", the
// library's "*" (Quartz's "no specific value"), so that "?/2" is "*/2".
func starred(f string) bool { return strings.HasPrefix(f, "*") || strings.HasPrefix(f, "?") }

// cronStar is the cron library's mark of a field given as "*" (its starBit): a day-of-month or
// day-of-week with it makes the other field's days match only along with it.
const cronStar = 1 << 63

// maxFirstFire is how soon a schedule must fire: five years (of 365 days), as the cron library's
// own next time looked.
const maxFirstFire = 5 * 365 * 24 * time.Hour

// wallCron is a cron expression of fields (five, or a descriptor such as @daily) in a zone. Its
// times are found on the zone's wall clock: each day whose date matches, each minute of it that
// matches, and the instants that wall time names there — none in a spring-forward's gap, two in a
// fall-back's repeat, as docs/cli.md says.
//
// The cron library's own next time steps through absolute hours and days, and over a clock change
// it missed or added fires: where the change skips midnight (Atlantic/Azores, America/Santiago,
// Africa/Cairo, Asia/Beirut) a Saturday's schedule fired on the Sunday too and a Friday's not at
// all; after Lord Howe's half-hour change a daily 23:00 was missed the next day; and where the
// offset is not in whole hours (Pacific/Chatham) its next time could come before the time given.
type wallCron struct {
	minute, hour, dom, month, dow uint64 // the library's bits; dom and dow with cronStar
	loc                           *time.Location
}

// maxCronDays bounds the days Next looks through: maxFirstFire and a day either side.
const maxCronDays = 5*366 + 2

// Next returns the first time after t, in the expression's zone, or the zero time if there is
// none within maxCronDays.
func (c wallCron) Next(t time.Time) time.Time {
	// From the day before t's: a fall-back at midnight repeats an hour of the day before.
	y, m, d := t.In(c.loc).Date()
	date := time.Date(y, m, d-1, 0, 0, 0, 0, time.UTC)
	for range maxCronDays {
		if !c.dayMatches(date) {
			date = date.AddDate(0, 0, 1)
			continue
		}
		n := c.firstOn(date, t)
		if n.IsZero() {
			date = date.AddDate(0, 0, 1)
			continue
		}
		// A day's times come before the next day's unless a clock change crosses midnight (one
		// from 00:30 back to 23:30 repeats the end of a day after the start of the next).
		next := date.AddDate(0, 0, 1)
		if (!c.steady(date) || !c.steady(next)) && c.dayMatches(next) {
			if later := c.firstOn(next, t); !later.IsZero() && later.Before(n) {
				n = later
			}
		}
		return n.In(c.loc)
	}
	return time.Time{}
}

// dayMatches reports whether the date (its year, month and day; in UTC) is one the expression
// fires on, as the cron library's dayMatches does: day of month and day of week both when either
// is marked with a star, either of them otherwise.
func (c wallCron) dayMatches(date time.Time) bool {
	if c.month&(1<<uint(date.Month())) == 0 {
		return false
	}
	dom, dow := c.dom&(1<<uint(date.Day())) != 0, c.dow&(1<<uint(date.Weekday())) != 0
	if c.dom&cronStar != 0 || c.dow&cronStar != 0 {
		return dom && dow
	}
	return dom || dow
}

// steady reports whether the zone's offset is the same all day on date, and for a few hours
// either side: its wall times then name one instant each, in their order. The zone's period that
// holds the day's midnight must hold the whole day: a midnight in a fall-back's repeat is either
// of two instants, and the offsets at the day's two midnights could agree across a change.
func (c wallCron) steady(date time.Time) bool {
	y, m, d := date.Date()
	midnight := time.Date(y, m, d, 0, 0, 0, 0, c.loc)
	from, to := midnight.ZoneBounds()
	return (from.IsZero() || from.Before(midnight.Add(-4*time.Hour))) && (to.IsZero() || to.After(midnight.Add(28*time.Hour)))
}

// firstOn returns the earliest instant after t that a matching wall time of date names, or the
// zero time.
func (c wallCron) firstOn(date, t time.Time) time.Time {
	y, m, d := date.Date()
	h0, m0 := 0, 0
	steady := c.steady(date)
	if steady {
		// One offset all day: the wall times after t's are the ones after t, in their order.
		_, off := time.Date(y, m, d, 12, 0, 0, 0, c.loc).Zone()
		lo := time.Unix(t.Unix()+int64(off), 0).UTC() // t's wall time there, in UTC's fields
		switch ly, lm, ld := lo.Date(); {
		case date.Before(time.Date(ly, lm, ld, 0, 0, 0, 0, time.UTC)):
			return time.Time{}
		case date.Equal(time.Date(ly, lm, ld, 0, 0, 0, 0, time.UTC)):
			h0, m0 = lo.Hour(), lo.Minute()
		}
	}
	// An instant is its wall time less the zone's offset, one of those a day either side has: a
	// wall time whose latest instant is not after t is passed over, and once one whose earliest
	// instant is after the best found is reached, no later one is better.
	least, most := c.offsets(date)
	var best time.Time
	for h := h0; h < 24; h++ {
		if c.hour&(1<<uint(h)) == 0 {
			continue
		}
		for mi := range 60 {
			if c.minute&(1<<uint(mi)) == 0 || h == h0 && mi < m0 {
				continue
			}
			wall := time.Date(y, m, d, h, mi, 0, 0, time.UTC).Unix()
			if wall-least <= t.Unix() {
				continue
			}
			if !best.IsZero() && wall-most > best.Unix() {
				return best
			}
			for _, n := range c.instants(time.Unix(wall, 0).UTC()) {
				if n.After(t) && (best.IsZero() || n.Before(best)) {
					best = n
				}
			}
			if steady && !best.IsZero() {
				return best
			}
		}
	}
	return best
}

// offsets returns the least and the most of the zone's offsets (seconds east of UTC) from a day
// before date to a day after: those instants probes.
func (c wallCron) offsets(date time.Time) (least, most int64) {
	least, most = math.MaxInt64, math.MinInt64
	for _, h := range [...]int{-26, 0, 12, 24, 50} {
		_, off := date.Add(time.Duration(h) * time.Hour).In(c.loc).Zone()
		least, most = min(least, int64(off)), max(most, int64(off))
	}
	return least, most
}

// instants returns the instants at which the zone's clock reads wall (a wall time, in UTC's
// fields): none in a gap, two in a repeat, one otherwise. The zone's offsets a day either side
// of it are the ones it can have there.
func (c wallCron) instants(wall time.Time) []time.Time {
	var out []time.Time
	u := wall.Unix()
	for _, probe := range [3]int64{u - 26*3600, u, u + 26*3600} {
		_, off := time.Unix(probe, 0).In(c.loc).Zone()
		n := time.Unix(u-int64(off), 0)
		if l := n.In(c.loc); sameWall(l, wall) && !slices.ContainsFunc(out, n.Equal) {
			out = append(out, n)
		}
	}
	return out
}

// sameWall reports whether l reads the wall time wall, to the minute.
func sameWall(l, wall time.Time) bool {
	ly, lm, ld := l.Date()
	wy, wm, wd := wall.Date()
	return ly == wy && lm == wm && ld == wd && l.Hour() == wall.Hour() && l.Minute() == wall.Minute()
}
