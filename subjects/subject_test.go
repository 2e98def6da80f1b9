package subjects_test

import (
	"strings"
	"testing"

	"github.com/natstone/natstone/subjects"
)

func TestOpsList(t *testing.T) {
	want := []subjects.Op{
		"create", "info", "update", "delete", "list",
		"enqueue", "enqueue_batch", "enqueue_raw", "dequeue", "abandon",
		"complete", "extend", "release", "cancel", "retry", "reschedule", "get", "depth",
		"stats", "browse", "history", "schedule", "unschedule", "schedules",
		"schedule_pause", "schedule_resume", "schedule_fire",
	}
	if len(subjects.Ops) != len(want) {
		t.Fatalf("len(Ops) = %d, want %d", len(subjects.Ops), len(want))
	}
	for i, op := range want {
		if subjects.Ops[i] != op {
			t.Errorf("Ops[%d] = %q, want %q", i, subjects.Ops[i], op)
		}
	}
}

func TestNewSpaceDefault(t *testing.T) {
	s := mustSpace(t, "")
	if s.Prefix() != subjects.DefaultPrefix || s.Prefix() != "natstone.v1" {
		t.Fatalf("NewSpace(\"\").Prefix() = %q, want %q", s.Prefix(), subjects.DefaultPrefix)
	}
	if got := mustSpace(t, subjects.DefaultPrefix); got != s {
		t.Fatalf("NewSpace(DefaultPrefix) = %v, want %v", got, s)
	}
}

func TestNewSpaceValid(t *testing.T) {
	for _, prefix := range []string{
		"a",
		"natstone",
		"natstone.v2",
		"acme.prod.natstone.v1",
		"x-y_z.v2",
		"$NS.tenant:1",
		"préfixe.✓",
		strings.Repeat("t.", 20) + "end",
	} {
		s, err := subjects.NewSpace(prefix)
		if err != nil {
			t.Errorf("NewSpace(%q): %v", prefix, err)
			continue
		}
		if s.Prefix() != prefix {
			t.Errorf("NewSpace(%q).Prefix() = %q", prefix, s.Prefix())
		}
	}
}

func TestNewSpaceInvalid(t *testing.T) {
	for _, prefix := range []string{
		".",
		"..",
		"a..b",
		"natstone..v1",
		".a",
		"a.",
		"*",
		">",
		"a.*",
		"a.>",
		"*.a",
		"a*b",
		"a>b",
		"a b",
		" a",
		"a ",
		"a\tb",
		"a\nb",
		"a\rb",
		"a\x00b",
		"a\x1fb",
		"a\x7fb",
	} {
		s, err := subjects.NewSpace(prefix)
		if err == nil {
			t.Errorf("NewSpace(%q) = %v, want an error", prefix, s)
			continue
		}
		if s != (subjects.Space{}) {
			t.Errorf("NewSpace(%q) returned a non-zero Space %v with its error", prefix, s)
		}
		if !strings.Contains(err.Error(), "invalid subject prefix") {
			t.Errorf("NewSpace(%q) error = %q, want it to mention the invalid prefix", prefix, err)
		}
	}
}

// TestSubjectEveryOp lists the literal subject of every operation: the strings are the protocol.
func TestSubjectEveryOp(t *testing.T) {
	tests := []struct {
		op       subjects.Op
		subject  string // with queue "encode"
		wildcard string
	}{
		{subjects.OpCreate, "natstone.v1.create.encode", "natstone.v1.create.*"},
		{subjects.OpInfo, "natstone.v1.info.encode", "natstone.v1.info.*"},
		{subjects.OpUpdate, "natstone.v1.update.encode", "natstone.v1.update.*"},
		{subjects.OpDelete, "natstone.v1.delete.encode", "natstone.v1.delete.*"},
		{subjects.OpList, "natstone.v1.list", "natstone.v1.list"},
		{subjects.OpEnqueue, "natstone.v1.enqueue.encode", "natstone.v1.enqueue.*"},
		{subjects.OpEnqueueBatch, "natstone.v1.enqueue_batch.encode", "natstone.v1.enqueue_batch.*"},
		{subjects.OpEnqueueRaw, "natstone.v1.enqueue_raw.encode", "natstone.v1.enqueue_raw.*"},
		{subjects.OpDequeue, "natstone.v1.dequeue.encode", "natstone.v1.dequeue.*"},
		{subjects.OpAbandon, "natstone.v1.abandon.encode", "natstone.v1.abandon.*"},
		{subjects.OpComplete, "natstone.v1.complete.encode", "natstone.v1.complete.*"},
		{subjects.OpExtend, "natstone.v1.extend.encode", "natstone.v1.extend.*"},
		{subjects.OpRelease, "natstone.v1.release.encode", "natstone.v1.release.*"},
		{subjects.OpCancel, "natstone.v1.cancel.encode", "natstone.v1.cancel.*"},
		{subjects.OpRetry, "natstone.v1.retry.encode", "natstone.v1.retry.*"},
		{subjects.OpReschedule, "natstone.v1.reschedule.encode", "natstone.v1.reschedule.*"},
		{subjects.OpGet, "natstone.v1.get.encode", "natstone.v1.get.*"},
		{subjects.OpDepth, "natstone.v1.depth.encode", "natstone.v1.depth.*"},
		{subjects.OpStats, "natstone.v1.stats.encode", "natstone.v1.stats.*"},
		{subjects.OpBrowse, "natstone.v1.browse.encode", "natstone.v1.browse.*"},
		{subjects.OpHistory, "natstone.v1.history.encode", "natstone.v1.history.*"},
		{subjects.OpSchedule, "natstone.v1.schedule.encode", "natstone.v1.schedule.*"},
		{subjects.OpUnschedule, "natstone.v1.unschedule.encode", "natstone.v1.unschedule.*"},
		{subjects.OpSchedules, "natstone.v1.schedules.encode", "natstone.v1.schedules.*"},
		{subjects.OpSchedulePause, "natstone.v1.schedule_pause.encode", "natstone.v1.schedule_pause.*"},
		{subjects.OpScheduleResume, "natstone.v1.schedule_resume.encode", "natstone.v1.schedule_resume.*"},
		{subjects.OpScheduleFire, "natstone.v1.schedule_fire.encode", "natstone.v1.schedule_fire.*"},
	}
	if len(tests) != len(subjects.Ops) {
		t.Fatalf("table covers %d ops, Ops has %d", len(tests), len(subjects.Ops))
	}
	s := mustSpace(t, "")
	for _, tc := range tests {
		t.Run(string(tc.op), func(t *testing.T) {
			if got := s.Subject(tc.op, "encode"); got != tc.subject {
				t.Errorf("Subject(%q, encode) = %q, want %q", tc.op, got, tc.subject)
			}
			if got := s.Wildcard(tc.op); got != tc.wildcard {
				t.Errorf("Wildcard(%q) = %q, want %q", tc.op, got, tc.wildcard)
			}
			op, queue, err := s.Parse(tc.subject)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.subject, err)
			}
			wantQueue := "encode"
			if tc.op == subjects.OpList {
				wantQueue = ""
			}
			if op != tc.op || queue != wantQueue {
				t.Errorf("Parse(%q) = (%q, %q), want (%q, %q)", tc.subject, op, queue, tc.op, wantQueue)
			}
		})
	}
}

func TestSubjectListIgnoresQueue(t *testing.T) {
	s := mustSpace(t, "")
	for _, q := range []string{"", "encode", "a.b", "*"} {
		if got := s.Subject(subjects.OpList, q); got != "natstone.v1.list" {
			t.Errorf("Subject(list, %q) = %q, want natstone.v1.list", q, got)
		}
	}
}

func TestSubjectCustomPrefixes(t *testing.T) {
	for _, prefix := range []string{"a", "acme.prod.natstone", "x-y_z.v2.q", "$NS.t1"} {
		s := mustSpace(t, prefix)
		for _, op := range subjects.Ops {
			queue := "Queue_9-x"
			subj := s.Subject(op, queue)
			want := prefix + "." + string(op) + "." + queue
			wantWild := prefix + "." + string(op) + ".*"
			if op == subjects.OpList {
				want, wantWild, queue = prefix+".list", prefix+".list", ""
			}
			if subj != want {
				t.Errorf("[%s] Subject(%q) = %q, want %q", prefix, op, subj, want)
			}
			if got := s.Wildcard(op); got != wantWild {
				t.Errorf("[%s] Wildcard(%q) = %q, want %q", prefix, op, got, wantWild)
			}
			gotOp, gotQueue, err := s.Parse(subj)
			if err != nil {
				t.Errorf("[%s] Parse(%q): %v", prefix, subj, err)
				continue
			}
			if gotOp != op || gotQueue != queue {
				t.Errorf("[%s] Parse(%q) = (%q, %q), want (%q, %q)", prefix, subj, gotOp, gotQueue, op, queue)
			}
		}
		if got := s.Serving(); got != prefix+".serving" {
			t.Errorf("[%s] Serving() = %q, want %q", prefix, got, prefix+".serving")
		}
		if _, _, err := s.Parse(s.Serving()); err == nil { // no op: the broker does not serve it
			t.Errorf("[%s] Parse(%q) took it for a request", prefix, s.Serving())
		}
	}
}

// TestParseOtherSpace checks a subject of one space is rejected by a space with a different prefix,
// including prefixes that are string prefixes of each other.
func TestParseOtherSpace(t *testing.T) {
	spaces := []string{"a", "a.b", "ab", "natstone.v1", "natstone.v10", "natstone"}
	for _, from := range spaces {
		subj := mustSpace(t, from).Subject(subjects.OpEnqueue, "q")
		for _, to := range spaces {
			if to == from {
				continue
			}
			op, queue, err := mustSpace(t, to).Parse(subj)
			// e.g. space "a" sees "a.b.enqueue.q" as op "b" (unknown), space "natstone" sees op "v1".
			if err == nil {
				t.Errorf("space %q parsed %q (from space %q) as (%q, %q)", to, subj, from, op, queue)
				continue
			}
			wantCode(t, err, subjects.CodeBadRequest)
		}
	}
}

func TestParseErrors(t *testing.T) {
	long := strings.Repeat("q", subjects.MaxQueueNameLen+1)
	tests := []struct {
		name    string
		prefix  string
		subject string
		code    subjects.Code
	}{
		// Outside the prefix.
		{"empty subject", "", "", subjects.CodeBadRequest},
		{"prefix only", "", "natstone.v1", subjects.CodeBadRequest},
		{"other prefix", "", "other.v1.enqueue.q", subjects.CodeBadRequest},
		{"other version", "", "natstone.v2.enqueue.q", subjects.CodeBadRequest},
		{"prefix glued to op", "", "natstone.v1enqueue.q", subjects.CodeBadRequest},
		{"prefix as longer token", "", "natstone.v10.enqueue.q", subjects.CodeBadRequest},
		{"case of prefix", "", "NATSTONE.v1.enqueue.q", subjects.CodeBadRequest},
		{"leading dot", "", ".natstone.v1.enqueue.q", subjects.CodeBadRequest},
		{"partial custom prefix", "acme.prod", "acme.enqueue.q", subjects.CodeBadRequest},
		{"default under custom", "acme.prod", "natstone.v1.enqueue.q", subjects.CodeBadRequest},
		// Unknown operation.
		{"unknown op", "", "natstone.v1.push.q", subjects.CodeBadRequest},
		{"op case", "", "natstone.v1.ENQUEUE.q", subjects.CodeBadRequest},
		{"empty op", "", "natstone.v1.", subjects.CodeBadRequest},
		{"empty op with queue", "", "natstone.v1..q", subjects.CodeBadRequest},
		{"wildcard op", "", "natstone.v1.*.q", subjects.CodeBadRequest},
		{"full wildcard op", "", "natstone.v1.>", subjects.CodeBadRequest},
		{"op with space", "", "natstone.v1.enqueue .q", subjects.CodeBadRequest},
		{"unknown op custom prefix", "a.b.c", "a.b.c.lst", subjects.CodeBadRequest},
		// Missing queue.
		{"enqueue without queue", "", "natstone.v1.enqueue", subjects.CodeBadRequest},
		{"dequeue without queue custom", "a.b", "a.b.dequeue", subjects.CodeBadRequest},
		// list with a queue.
		{"list with queue", "", "natstone.v1.list.q", subjects.CodeBadRequest},
		{"list with empty queue", "", "natstone.v1.list.", subjects.CodeBadRequest},
		{"list with two tokens", "", "natstone.v1.list.a.b", subjects.CodeBadRequest},
		// Bad queue names.
		{"empty queue token", "", "natstone.v1.enqueue.", subjects.CodeInvalidQueueName},
		{"dotted queue", "", "natstone.v1.enqueue.a.b", subjects.CodeInvalidQueueName},
		{"wildcard queue", "", "natstone.v1.enqueue.*", subjects.CodeInvalidQueueName},
		{"full wildcard queue", "", "natstone.v1.enqueue.>", subjects.CodeInvalidQueueName},
		{"queue with space", "", "natstone.v1.enqueue.a b", subjects.CodeInvalidQueueName},
		{"unicode queue", "", "natstone.v1.enqueue.é", subjects.CodeInvalidQueueName},
		{"queue too long", "", "natstone.v1.enqueue." + long, subjects.CodeInvalidQueueName},
		{"queue with colon", "acme", "acme.get.a:b", subjects.CodeInvalidQueueName},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustSpace(t, tc.prefix)
			op, queue, err := s.Parse(tc.subject)
			if err == nil {
				t.Fatalf("Parse(%q) = (%q, %q), want code %q", tc.subject, op, queue, tc.code)
			}
			if op != "" || queue != "" {
				t.Errorf("Parse(%q) returned (%q, %q) with its error, want empty", tc.subject, op, queue)
			}
			wantCode(t, err, tc.code)
		})
	}
}

// TestParseMissingQueueEveryOp checks every operation but list demands a queue token.
func TestParseMissingQueueEveryOp(t *testing.T) {
	s := mustSpace(t, "")
	for _, op := range subjects.Ops {
		if op == subjects.OpList {
			continue
		}
		_, _, err := s.Parse("natstone.v1." + string(op))
		wantCode(t, err, subjects.CodeBadRequest)
	}
}

func TestValidateQueueName(t *testing.T) {
	valid := []string{
		"a", "z", "A", "Z", "0", "9", "_", "-",
		"encode", "Encode_Jobs-2", "__", "--", "0123456789",
		queueAlphabet,
		queueAlphabet + queueAlphabet, // 128: the limit
		strings.Repeat("x", subjects.MaxQueueNameLen),
	}
	for _, name := range valid {
		if err := subjects.ValidateQueueName(name); err != nil {
			t.Errorf("ValidateQueueName(%q): %v", name, err)
		}
	}
	invalid := []string{
		"",
		strings.Repeat("x", subjects.MaxQueueNameLen+1),
		strings.Repeat("x", 1000),
		".", "a.b", "a.", ".a",
		" ", "a b", " a", "a ", "a\tb", "a\n",
		"*", ">", "a*", "a>",
		"é", "héllo", "✓", "日本", "\xff", "a\xc3",
		"\x00", "a\x00", "\x7f",
		"/", ":", "@", "[", "`", "{", // the neighbours of the allowed ASCII ranges
		"a/b", "a+b", "a=b", "a~b", "a$b",
	}
	for _, name := range invalid {
		err := subjects.ValidateQueueName(name)
		if err == nil {
			t.Errorf("ValidateQueueName(%q) = nil, want invalid_queue_name", name)
			continue
		}
		wantCode(t, err, subjects.CodeInvalidQueueName)
	}
}

// TestValidateQueueNameEveryByte checks each single byte against the allowed alphabet.
func TestValidateQueueNameEveryByte(t *testing.T) {
	for b := range 256 {
		name := string([]byte{byte(b)})
		want := strings.IndexByte(queueAlphabet, byte(b)) >= 0
		err := subjects.ValidateQueueName(name)
		if got := err == nil; got != want {
			t.Errorf("ValidateQueueName(%q) valid = %v, want %v", name, got, want)
		}
		if err != nil {
			wantCode(t, err, subjects.CodeInvalidQueueName)
		}
		// The same byte in the middle of an otherwise valid name.
		mid := "ab" + name + "cd"
		if got := subjects.ValidateQueueName(mid) == nil; got != want {
			t.Errorf("ValidateQueueName(%q) valid = %v, want %v", mid, got, want)
		}
	}
}

// TestCronZone: a cron's leading CRON_TZ= or TZ= is its zone, cut at the first space; without one
// the cron is all expression.
func TestCronZone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cron, zone, expr string
		zoned            bool
	}{
		{"CRON_TZ=Asia/Tokyo 0 9 * * *", "Asia/Tokyo", "0 9 * * *", true},
		{"TZ=UTC @daily", "UTC", "@daily", true},
		{"CRON_TZ=Europe/Paris", "Europe/Paris", "", true},
		{"CRON_TZ= 0 9 * * *", "", "0 9 * * *", true},
		{"0 9 * * *", "", "0 9 * * *", false},
		{"@every 90s", "", "@every 90s", false},
		{"0 9 * * * CRON_TZ=Asia/Tokyo", "", "0 9 * * * CRON_TZ=Asia/Tokyo", false},
	} {
		zone, expr, zoned := subjects.CronZone(tc.cron)
		if zone != tc.zone || expr != tc.expr || zoned != tc.zoned {
			t.Errorf("CronZone(%q) = %q, %q, %v; want %q, %q, %v", tc.cron, zone, expr, zoned, tc.zone, tc.expr, tc.zoned)
		}
	}
}
