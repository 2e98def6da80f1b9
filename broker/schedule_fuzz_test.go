package broker

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// FuzzParseCron: a schedule's cron comes from any client. Parsing it never panics, refuses it with
// invalid_schedule, or accepts an expression that fires after now (any second from 2000 to 2100), at
// whole seconds, and whose next time after that is later still.
func FuzzParseCron(f *testing.F) {
	for _, s := range []string{
		"* * * * *", "*/5 * * * *", "0 9 * * 1-5", "0 0 30 2 *", "@hourly", "@every 90s", "@every 500ms",
		"CRON_TZ=America/New_York 0 9 * * *", "TZ=UTC @daily", "TZ=", "CRON_TZ= ", "0-59/0 * * * *",
		"1,2,3 1-2/1 ? JAN-DEC MON-FRI", "@every -1s", "@every 1h1s",
	} {
		f.Add(s, int64(1_700_000_000))
	}
	f.Add("CRON_TZ=Pacific/Chatham 0 3 * * *", int64(1_680_357_600)) // 2023-04-01T14:00Z: the clock goes back 45 minutes
	f.Add("CRON_TZ=Europe/Paris 0 2 * * *", int64(1_711_843_200))    // 2024-03-31: no 02:00
	f.Fuzz(func(t *testing.T, spec string, sec int64) {
		const from, to = 946_684_800, 4_102_444_800 // 2000 to 2100
		now := time.Unix(from+(sec%(to-from)+(to-from))%(to-from), 0).UTC()
		c, err := parseCron(spec, now)
		if err != nil {
			if subjects.CodeOf(err) != subjects.CodeInvalidSchedule {
				t.Fatalf("parseCron(%q): %v, want invalid_schedule", spec, err)
			}
			return
		}
		next := c.Next(now)
		if !next.After(now) || next.Nanosecond() != 0 {
			t.Fatalf("parseCron(%q) accepted; Next(%v) = %v, want a later whole second", spec, now, next)
		}
		if after := c.Next(next); !after.IsZero() && !after.After(next) {
			t.Fatalf("parseCron(%q): Next(%v) = %v, not later", spec, next, after)
		}
	})
}

// TestParseCronZones: a cron without a zone is in UTC whatever the machine's zone; CRON_TZ=Local,
// which would be the machine's, is refused; a zone's clock change never makes a time go back.
func TestParseCronZones(t *testing.T) {
	now := time.Date(2023, 4, 1, 14, 0, 0, 0, time.UTC)
	c, err := parseCron("0 9 * * *", now)
	if err != nil {
		t.Fatal(err)
	}
	if loc := c.(wallCron).loc; loc != time.UTC {
		t.Errorf("a cron without a zone is in %v, want UTC", loc)
	}
	for _, spec := range []string{
		"CRON_TZ=Local 0 9 * * *",
		"CRON_TZ= @hourly", // no zone named
		"0\t9 * * *",       // white space other than spaces, which the zone is cut at too
		"0\n9 * * *",
		"CRON_TZ=UTC\t@hourly",
	} {
		if _, err := parseCron(spec, now); subjects.CodeOf(err) != subjects.CodeInvalidSchedule {
			t.Errorf("%q: %v, want invalid_schedule", spec, err)
		}
	}
	if _, err := parseCron("@every 43801h", now); subjects.CodeOf(err) != subjects.CodeInvalidSchedule {
		t.Errorf("@every 5 years and an hour: %v, want invalid_schedule (it does not fire within 5 years)", err)
	}
	// Pacific/Chatham goes from UTC+13:45 to +12:45 at 03:45 local on 2023-04-02 (14:00 UTC on the 1st).
	c, err = parseCron("CRON_TZ=Pacific/Chatham 0 3 * * *", now)
	if err != nil {
		t.Fatal(err)
	}
	for t0, i := now, 0; i < 5; i++ {
		n := c.Next(t0)
		if !n.After(t0) {
			t.Fatalf("Next(%v) = %v, not after it", t0, n)
		}
		t0 = n
	}
}

// TestCronTimesAcrossClockChanges: a zoned cron fires at every instant whose wall time it matches,
// as a minute-by-minute search finds them, a few days either side of each of 2026's clock changes:
// none in a spring-forward's gap, twice in a fall-back's repeat, and on the right days where the
// change skips midnight (the cron library fired a Saturday's schedule on the Sunday too in the
// Azores, and not a Friday's in Cairo), is by half an hour (Lord Howe: it missed the next day's
// 23:00) or is not in whole hours (Chatham: its next time came before the time given).
func TestCronTimesAcrossClockChanges(t *testing.T) {
	zones := []string{"Atlantic/Azores", "America/Santiago", "America/Havana", "Asia/Beirut", "Africa/Cairo",
		"Australia/Lord_Howe", "Pacific/Chatham", "America/New_York", "Europe/Berlin", "Asia/Kolkata",
		// Changes at or across midnight in 2010, when these two had them: Amman went back from
		// 01:00 to 00:00 (a midnight in the repeat), St John's from 00:01 to 23:01.
		"Asia/Amman", "America/St_Johns"}
	specs := []string{"0 9 * * 6", "0 12 * * 5", "0 9 * * 0", "0 0 * * *", "0 23 * * *", "30 2 * * *",
		"*/30 * * * *", "5 0 28 3 *", "0 0 13 * 5", "45 1 * * 1-5", "@daily"}
	for _, zone := range zones {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		// The year's clock changes: where the offset differs from 15 minutes before.
		var changes []time.Time
		year := 2026
		if zone == "Asia/Amman" || zone == "America/St_Johns" {
			year = 2010
		}
		for u := time.Date(year, 1, 1, 0, 0, 0, 0, time.UTC); u.Year() == year; u = u.Add(15 * time.Minute) {
			_, a := u.Add(-15 * time.Minute).In(loc).Zone()
			if _, b := u.In(loc).Zone(); a != b {
				changes = append(changes, u)
			}
		}
		if len(changes) == 0 && zone != "Asia/Kolkata" && zone != "Africa/Cairo" {
			t.Errorf("%s: no clock change in 2026: the case tests little", zone)
		}
		changes = append(changes, time.Date(year, 6, 1, 0, 0, 0, 0, time.UTC)) // and a day with none
		for _, spec := range specs {
			c, err := parseCron("CRON_TZ="+zone+" "+spec, time.Date(year, 1, 1, 0, 0, 0, 0, time.UTC))
			if err != nil {
				t.Fatal(err)
			}
			w := c.(wallCron)
			for _, change := range changes {
				from, to := change.Add(-3*24*time.Hour), change.Add(3*24*time.Hour)
				var fires []time.Time // every matching minute, by brute force
				for u := from; u.Before(to.Add(2 * 24 * time.Hour)); u = u.Add(time.Minute) {
					l := u.In(loc)
					date := time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, time.UTC)
					if w.minute&(1<<uint(l.Minute())) != 0 && w.hour&(1<<uint(l.Hour())) != 0 && w.dayMatches(date) {
						fires = append(fires, u)
					}
				}
				for u := from; u.Before(to); u = u.Add(17 * time.Minute) {
					i, _ := slices.BinarySearchFunc(fires, u, func(f, u time.Time) int { return f.Compare(u.Add(time.Nanosecond)) })
					if i == len(fires) {
						continue // past what the search covers
					}
					if got := c.Next(u); !got.Equal(fires[i]) {
						t.Fatalf("CRON_TZ=%s %s: Next(%v) = %v, want %v (%v there)", zone, spec, u, got, fires[i], fires[i].In(loc))
					}
				}
			}
		}
	}
}

// TestParseCronAsVixieCron: what the cron library reads differently from Vixie cron (cronie) is
// read as Vixie cron does, or refused: "*/2" in the day of month combines with the day of week as
// "*" does (both must match), and a list with an empty element or a signed number is refused.
func TestParseCronAsVixieCron(t *testing.T) {
	now := time.Date(2026, 11, 27, 17, 0, 0, 0, time.UTC) // a Friday, the 27th
	for spec, want := range map[string]time.Time{
		"0 0 */2 * 1": time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC), // a Monday on an odd day: not Sunday the 29th
		"0 0 ?/2 * 1": time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC), // "?" is "*"
		"0 0 1 * */3": time.Date(2027, 5, 1, 0, 0, 0, 0, time.UTC),  // a 1st on a Sunday, Wednesday or Saturday: not Tuesday 1 December
		"0 0 13 * 5":  time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC), // neither field a star: Friday the 4th, or the 13th
		// A field that does not begin with a star is not one, whatever its list holds: either day
		// matches, and "*" in it makes every day match (the library took both as stars).
		"0 0 13,* * 5": time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC),
		"0 0 13 * 5,*": time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC),
		"0 0 *,13 * 5": time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC),  // begins with one: Fridays
		"0 0 * * 1":    time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC), // as before
		"0 0 3-5 * *":  time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC),
		// 7 is Sunday, as 0 is, alone, in ranges and steps, and by a name.
		"0 0 * * 7":       time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC),
		"0 0 * * 1,7":     time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC),
		"0 0 * * 6-7/2":   time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC), // Saturday alone: 8 is past the range
		"0 0 * * 1-7/3":   time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC), // Monday, Thursday, Sunday
		"0 0 * * 7/2":     time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC),
		"0 0 * * mon-7":   time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC),
		"0 0 13 * 7":      time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC), // the 13th or a Sunday
		"0 0 1 * */7":     time.Date(2027, 8, 1, 0, 0, 0, 0, time.UTC),   // "*/7" is Sundays already: a 1st on a Sunday
		"0 0 * 12 0-7/6":  time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC),  // Sunday, Saturday, Sunday: not 1 December, a Tuesday
		"0 0 * * 7-7":     time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC),
		"0 0 * * 07":      time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC), // as the library reads "05"
		"0 0 * * 06-07/2": time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC),
		// Fields apart by more than a space, as a crontab aligns them, the "@every" and the zone's too.
		"0  0 3-5 *  *":                      time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC),
		"@every  90s":                        now.Add(90 * time.Second),
		"CRON_TZ=Europe/Paris  0 2 * * *":    time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC),
		"TZ=America/New_York   @every    2h": now.Add(2 * time.Hour),
	} {
		c, err := parseCron(spec, now)
		if err != nil {
			t.Fatalf("%q: %v", spec, err)
		}
		if got := c.Next(now); !got.Equal(want) {
			t.Errorf("%q: next %v, want %v", spec, got, want)
		}
	}
	for _, spec := range []string{",1 * * * *", "1, * * * *", "1,,2 * * * *", "+1 * * * *", "0 0 * * 1-+5", "0 0 * * 8", "0 0 * * 7-1", "0 0 * * -7", "0 0 * * FOO-7", "0 0 * * 1x-7", "0 0 * * 08", "0 0 * * 7-0x1", "0 0 * * 5-8", "0 0 * * 7/0", "*-5 * * * *", "0 ?-3/2 * * *", "0 0 1,*-9 * *",
		"@every\u00a01500ms", "@every\u00851s", "@every\u30001s", "0\u00a00 * * *", "CRON_TZ=UTC\u20030 0 * * *"} {
		if _, err := parseCron(spec, now); subjects.CodeOf(err) != subjects.CodeInvalidSchedule {
			t.Errorf("%q: %v, want invalid_schedule", spec, err)
		}
	}
}

// BenchmarkCronNext: a zoned schedule's next time, which a late fire walks a million times at most.
func BenchmarkCronNext(b *testing.B) {
	for _, spec := range []string{"* * * * *", "0 9 * * 1-5", "0 0 29 2 *"} {
		c, err := parseCron("CRON_TZ=Europe/Berlin "+spec, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		if err != nil {
			b.Fatal(err)
		}
		for _, day := range []int{2, 28, 29} { // a day, the day before a clock change, and its day
			b.Run(fmt.Sprintf("%s/3-%d", spec, day), func(b *testing.B) {
				t := time.Date(2026, 3, day, 10, 17, 0, 0, time.UTC)
				for b.Loop() {
					c.Next(t)
				}
			})
		}
	}
}
