package broker

import (
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
	// Fields may be apart by more than one space, as in a crontab; the library's "@every" reads
	// what follows its first space as the duration.
	full := "CRON_TZ=" + zone + " " + strings.Join(fields, " ")
	if s, err = cronParser.Parse(full); err != nil {
		return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q: %v", spec, err)
	}
	if ss, ok := s.(*cron.SpecSchedule); ok {
		if len(fields) == 5 { // minute hour day-of-month month day-of-week
			if starred(fields[2]) {
				ss.Dom |= cronStar
			}
			if starred(fields[4]) {
				ss.Dow |= cronStar
			}
		}
		s = forward{ss}
	}
	if every, ok := strings.CutPrefix(expr, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(every))
		if err != nil || d < subjects.MinScheduleEvery || d%time.Second != 0 {
			return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q: @every takes a whole number of seconds, at least %v", spec, subjects.MinScheduleEvery)
		}
	}
	if n := s.Next(now); n.IsZero() || n.Sub(now) > maxFirstFire {
		return nil, subjects.Errorf(subjects.CodeInvalidSchedule, "cron %q does not fire within %v", spec, maxFirstFire)
	}
	return s, nil
}

// starred reports whether a cron field or list element begins with a star: "*", or "?", the
// library's "*" (Quartz's "no specific value"), so that "?/2" is "*/2".
func starred(f string) bool { return strings.HasPrefix(f, "*") || strings.HasPrefix(f, "?") }

// cronStar is the cron library's mark of a field given as "*" (its starBit): a day-of-month or
// day-of-week with it makes the other field's days match only along with it.
const cronStar = 1 << 63

// maxFirstFire is how soon a schedule must fire: the cron library looks five years ahead.
const maxFirstFire = 5 * 365 * 24 * time.Hour

// forward is a cron expression whose next time is always after the time given. The library's can
// be before it over a clock change in a zone whose offset is not in whole hours (Pacific/Chatham's
// 45 minutes): the next time is then found minute by minute.
type forward struct{ *cron.SpecSchedule }

func (f forward) Next(t time.Time) time.Time {
	n := f.SpecSchedule.Next(t)
	if n.IsZero() || n.After(t) {
		return n
	}
	// Stepped back: the first minute of the next three hours that the expression matches (the
	// library's next time after a second before it is that minute), else on from three hours later.
	for m := t.Truncate(time.Minute).Add(time.Minute); m.Sub(t) <= 3*time.Hour; m = m.Add(time.Minute) {
		if f.SpecSchedule.Next(m.Add(-time.Second)).Equal(m) {
			return m
		}
	}
	if n = f.SpecSchedule.Next(t.Add(3 * time.Hour)); !n.After(t) {
		return time.Time{}
	}
	return n
}
