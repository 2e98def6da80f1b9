package broker

import (
	"testing"
	"time"

	"github.com/natstone/natstone/subjects"
)

// FuzzParseCron: a schedule's cron comes from any client. Parsing it never panics, refuses it with
// invalid_schedule, or accepts an expression that fires after now, at whole seconds.
func FuzzParseCron(f *testing.F) {
	for _, s := range []string{
		"* * * * *", "*/5 * * * *", "0 9 * * 1-5", "0 0 30 2 *", "@hourly", "@every 90s", "@every 500ms",
		"CRON_TZ=America/New_York 0 9 * * *", "TZ=UTC @daily", "TZ=", "CRON_TZ= ", "0-59/0 * * * *",
		"1,2,3 1-2/1 ? JAN-DEC MON-FRI", "@every -1s", "@every 1h1s",
	} {
		f.Add(s)
	}
	now := time.UnixMilli(1_700_000_000_000)
	f.Fuzz(func(t *testing.T, spec string) {
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
	})
}
