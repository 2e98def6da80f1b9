package faults

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/subjects"
)

// churnQueue is the queue that churn creates, fills and deletes, over and over.
const churnQueue = "churn"

// churnMessages is how many messages each generation of churnQueue is filled with. Every
// generation uses the same ids, churnID(0) to churnID(churnMessages-1).
const churnMessages = 12

func churnID(i int) string { return fmt.Sprintf("m%d", i) }

// churnPayload is message i's payload in generation gen: what names the generation a dequeue or
// a get returns.
func churnPayload(gen, i int) string { return fmt.Sprintf("generation %d message %d", gen, i) }

// churner is an operator who creates a queue (simple and exclusive in turn), updates its config
// twice, fills it, leases and completes some of its messages, and deletes it with messages still
// running, over and over, under the run's kills. Each generation of the queue reuses the message
// ids of the one before, with payloads that name their generation. It checks, and reports a
// violation otherwise:
//   - a deleted queue stays deleted: after a delete is acknowledged, the queue is not found until
//     it is created again, and then with the config it is created with, not one it had before;
//   - an acknowledged update stays;
//   - nothing of a deleted generation comes back: an enqueue of a reused id stores a new message
//     (it is no duplicate, unless an earlier try of that same enqueue had an unknown outcome), and
//     every message a dequeue or a get returns carries this generation's payload;
//   - nothing acknowledged is lost before the delete: the queue holds every message enqueued, and
//     the delete's reply counts them;
//   - an acknowledged delete leaves nothing of the queue in storage: no payload, record or lock
//     (unless a kill follows before that is read: see leftNothing).
//
// Its requests are not in the run's history: the checker would count the deleted messages lost.
// payloadsMatch, at the end of the run, checks that the deletes left no payload behind.
type churner struct {
	c     *client
	js    jetstream.JetStream
	rng   *rand.Rand
	stop  <-chan struct{}
	stats *runStats
	gen   int
}

// churn runs a churner until stop.
func churn(c *client, stop <-chan struct{}, stats *runStats) {
	js, err := jetstream.New(c.nc)
	if err != nil {
		panic(err)
	}
	ch := &churner{c: c, js: js, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11)), stop: stop, stats: stats}
	for ch.gen = 1; ch.generation(); ch.gen++ {
		stats.add(func(s *runStats) { s.churned++ })
		if ch.gen == 1 {
			close(stats.churnedOnce)
		}
	}
}

// violation records what the churner saw go wrong.
func (ch *churner) violation(format string, args ...any) {
	v := Violation{Rule: "queue-delete", Detail: fmt.Sprintf("generation %d: ", ch.gen) + fmt.Sprintf(format, args...)}
	ch.stats.add(func(s *runStats) { s.churnViolations = append(s.churnViolations, v) })
}

// call sends a request until its outcome is known, as a client retries one whose outcome is
// unknown or that nobody received (natstone restarting). It reports whether any try's outcome was
// unknown, and ok false if the run stopped first.
func (ch *churner) call(op subjects.Op, body, out any) (o Outcome, code string, unsure, ok bool) {
	for {
		o, code = ch.c.call(op, churnQueue, body, out)
		if o != Unknown && code != "no_responders" {
			return o, code, unsure, true
		}
		unsure = unsure || o == Unknown
		select {
		case <-ch.stop:
			return o, code, unsure, false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// pause waits up to maxMS milliseconds, so that the kills land in every step of a generation. It
// reports false if the run stopped.
func (ch *churner) pause(maxMS int) bool {
	select {
	case <-ch.stop:
		return false
	case <-time.After(time.Duration(ch.rng.IntN(maxMS)) * time.Millisecond):
		return true
	}
}

// generation runs one generation of the queue: it checks the queue is gone, creates it, fills it,
// works on some of its messages and deletes it. It reports false once the run stops.
func (ch *churner) generation() bool {
	var d subjects.DepthReply
	o, code, _, ok := ch.call(subjects.OpDepth, nil, &d)
	switch {
	case !ok:
		return false
	case o == OK && ch.gen > 1:
		ch.violation("the queue deleted before is there again, holding %+v", d.Counts)
	case o == Failed && code != string(subjects.CodeQueueNotFound):
		ch.violation("depth before the create: %s", code)
	}

	retention := time.Hour.Milliseconds()
	create := subjects.CreateQueueRequest{LeaseMS: 800, MaxAttempts: 3, RetentionMS: &retention}
	if ch.gen%2 == 0 {
		create.Type, create.ExclusivityKey = subjects.Exclusive, "p" // its locks go with it too
	}
	var info subjects.QueueInfo
	if o, code, _, ok = ch.call(subjects.OpCreate, create, &info); !ok {
		return false
	} else if o != OK {
		ch.violation("create: %s", code)
		return true
	} else if info.Config.LeaseMS != 800 || info.Config.MaxAttempts != 3 {
		ch.violation("created with lease_ms 800 and max_attempts 3, the queue has %d and %d", info.Config.LeaseMS, info.Config.MaxAttempts)
	}
	// Two updates, so that the config has superseded revisions when it is deleted.
	for _, u := range []subjects.UpdateQueueRequest{{MaxAttempts: ptr(5)}, {LeaseMS: ptr[int64](900)}} {
		if o, code, _, ok = ch.call(subjects.OpUpdate, u, &subjects.QueueInfo{}); !ok {
			return false
		} else if o != OK {
			ch.violation("update: %s", code)
		}
	}

	enqueued := 0
	for i := range churnMessages {
		req := subjects.EnqueueRequest{ID: churnID(i), Priority: ptr(int64(i)), Payload: churnPayload(ch.gen, i),
			Metadata: map[string]string{"p": fmt.Sprintf("v%d", i%4)}}
		var r subjects.EnqueueReply
		o, code, unsure, ok := ch.call(subjects.OpEnqueue, req, &r)
		switch {
		case !ok:
			return false
		case o != OK:
			ch.violation("enqueue %s: %s", req.ID, code)
			continue
		case r.Duplicate && !unsure:
			ch.violation("enqueue %s: a duplicate, on its first try: a deleted generation's message is back", req.ID)
		}
		enqueued++
	}
	if !ch.pause(100) {
		return false
	}

	var dr subjects.DequeueReply
	o, code, _, ok = ch.call(subjects.OpDequeue, subjects.DequeueRequest{Batch: 1 + ch.rng.IntN(5), RequestID: fmt.Sprintf("churn-%d", ch.gen)}, &dr)
	if !ok {
		return false
	}
	if o != OK {
		ch.violation("dequeue: %s", code)
	}
	for _, m := range dr.Messages {
		ch.checkPayload("dequeue", m)
		if ch.rng.IntN(2) == 0 {
			continue // left running through the delete
		}
		if o, code, _, ok := ch.call(subjects.OpComplete, subjects.LeaseRequest{ID: m.ID, LeaseID: m.LeaseID}, &subjects.Message{}); !ok {
			return false
		} else if o != OK && !leaseRanOut(code) {
			ch.violation("complete %s: %s", m.ID, code)
		}
	}
	var m subjects.Message
	id := churnID(ch.rng.IntN(churnMessages))
	if o, code, _, ok = ch.call(subjects.OpGet, subjects.GetRequest{ID: id}, &m); !ok {
		return false
	} else if o != OK {
		ch.violation("get %s: %s", id, code)
	} else {
		ch.checkPayload("get", m)
	}
	if o, code, _, ok = ch.call(subjects.OpDepth, nil, &d); !ok {
		return false
	} else if c := d.Counts; o != OK {
		ch.violation("depth: %s", code)
	} else if n := c.Invisible + c.Pending + c.Running + c.Completed + c.Canceled + c.Errored; n != enqueued {
		ch.violation("the queue holds %d messages (%+v), %d were enqueued", n, c, enqueued)
	}
	if o, code, _, ok = ch.call(subjects.OpInfo, nil, &info); !ok {
		return false
	} else if o != OK {
		ch.violation("info: %s", code)
	} else if info.Config.LeaseMS != 900 || info.Config.MaxAttempts != 5 {
		ch.violation("updated to lease_ms 900 and max_attempts 5, the queue has %d and %d", info.Config.LeaseMS, info.Config.MaxAttempts)
	}
	if !ch.pause(100) {
		return false
	}

	var del subjects.DeleteReply
	sent := time.Now()
	o, code, unsure, ok := ch.call(subjects.OpDelete, nil, &del)
	faults, acked := ch.stats.faults.Load(), time.Now()
	switch {
	case !ok:
		return false
	case o == OK && !unsure && del.Messages != enqueued:
		ch.violation("the delete counted %d messages, %d were enqueued", del.Messages, enqueued)
	case o == Failed && unsure && code == string(subjects.CodeQueueNotFound):
		// An earlier try deleted it.
	case o == Failed:
		ch.violation("delete: %s", code)
	}
	if o == OK || code == string(subjects.CodeQueueNotFound) {
		return ch.leftNothing(faults, fmt.Sprintf("sent at %s, answered at %s (sent again: %t)", ts(sent), ts(acked), unsure)) && ch.pause(100)
	}
	return ch.pause(100)
}

// leftNothing checks that the queue's delete, acknowledged when the run's fault count was faults,
// left nothing of the queue in storage: no payload, record or lock. A violation says when (the
// delete's times, and the read's). The check stands only if no
// kill began since (or was under way then): after an unclean stop JetStream brings back records
// that were removed (nats-server#8505), at every restart, and the broker's start removes them again
// (Broker.dropDeleted), leaving purge markers for a second. It reports false if the run stopped
// first.
func (ch *churner) leftNothing(faults int64, when string) bool {
	left := map[string]uint64{}
	var read time.Time
	for _, in := range [][2]string{
		{"natstone-bodies", "natstone.body." + churnQueue},
		{"KV_natstone-messages", "$KV.natstone-messages." + churnQueue + ".>"},
		{"KV_natstone-locks", "$KV.natstone-locks." + churnQueue + ".>"},
	} {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
			read = time.Now()
			st, err := ch.js.Stream(ctx, in[0])
			var info *jetstream.StreamInfo
			if err == nil {
				info, err = st.Info(ctx, jetstream.WithSubjectFilter(in[1]))
			}
			cancel()
			if err == nil {
				maps.Copy(left, info.State.Subjects)
				break
			}
			select {
			case <-ch.stop:
				return false
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	switch {
	case faults%2 == 1 || ch.stats.faults.Load() != faults:
		ch.stats.add(func(s *runStats) { s.churnUnchecked++ })
	case len(left) > 0:
		markers, unbacked := ch.dropMarkers(left)
		ch.stats.add(func(s *runStats) { s.churnMarkers += markers; s.churnUnbacked += unbacked })
		if len(left) > 0 {
			ch.violation("the acknowledged delete (%s) left %v, read at %s: %s", when, left, ts(read), ch.describe(left))
		}
	}
	return true
}

// dropMarkers removes from left the subjects of the messages and locks buckets whose last message is
// a KV delete or purge marker, and returns how many. Such a marker holds no record: a load skips its
// key, and a create writes over it. A broker's start writes them when it removes records of deleted
// queues that JetStream brought back (Broker.dropDeleted), with a TTL of a second, and a delete's
// subject purge soon after has been seen to leave them (2026-11-25, docs/faults.md): the server's,
// not natstone's, and no record, so not a violation; counted in the run's stats. It removes too, and
// counts as unbacked, the subjects whose last message is not found when read: the server's count of
// them was of a message gone by then (a marker whose TTL ran out between the two reads, as one run
// in five of `make faults-long KILLS=20` saw on 2026-11-28), so nothing of the queue is there.
func (ch *churner) dropMarkers(left map[string]uint64) (markers, unbacked int) {
	for subj := range left {
		m, err := ch.lastMsg(subj)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			delete(left, subj)
			unbacked++
		case err != nil || strings.HasPrefix(subj, "natstone.body."): // a payload is never a marker
		case m.Header.Get("KV-Operation") == "PURGE" || m.Header.Get("KV-Operation") == "DEL":
			delete(left, subj)
			markers++
		}
	}
	return markers, unbacked
}

// lastMsg reads the last message on subj from the stream that holds it.
func (ch *churner) lastMsg(subj string) (*jetstream.RawStreamMsg, error) {
	stream := "KV_natstone-messages"
	switch {
	case strings.HasPrefix(subj, "natstone.body."):
		stream = "natstone-bodies"
	case strings.HasPrefix(subj, "$KV.natstone-locks."):
		stream = "KV_natstone-locks"
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	st, err := ch.js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	return st.GetLastMsgForSubject(ctx, subj)
}

// describe says what the streams hold on the subjects left: each one's last message (its sequence,
// time and headers), or why it could not be read — a count of the server's per-subject state that
// no message backs is not the same finding as a message.
func (ch *churner) describe(left map[string]uint64) string {
	var out []string
	for subj := range left {
		m, err := ch.lastMsg(subj)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: not read (%v)", subj, err))
			continue
		}
		out = append(out, fmt.Sprintf("%s: seq %d at %s, headers %v, %d bytes", subj, m.Sequence, m.Time.Format(time.RFC3339Nano), m.Header, len(m.Data)))
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

// leaseRanOut reports whether code is how a complete is refused once its lease ran out (a kill
// can outlast a lease), and maybe another lease took the message.
func leaseRanOut(code string) bool {
	switch subjects.Code(code) {
	case subjects.CodeLeaseExpired, subjects.CodeLeaseMismatch, subjects.CodeInvalidState:
		return true
	}
	return false
}

// checkPayload reports a message that is not this generation's.
func (ch *churner) checkPayload(what string, m subjects.Message) {
	var i int
	if _, err := fmt.Sscanf(m.ID, "m%d", &i); err != nil {
		ch.violation("%s returned message %q, which was never enqueued", what, m.ID)
		return
	}
	if want := churnPayload(ch.gen, i); m.Payload == nil || *m.Payload != want {
		got := "no payload"
		if m.Payload != nil {
			got = fmt.Sprintf("%q", *m.Payload)
		}
		ch.violation("%s returned %s with %s, not %q: a deleted generation's message", what, m.ID, got, want)
	}
}
