package broker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// TestAckWaitsEndAtTheirStreamsElection: the waits of message writes for their acknowledgements
// end (for the writes to be issued again) when the messages stream elects a leader, those of lock
// writes when the locks stream does, and those of payload writes when the payloads stream does;
// each election ends the waits begun before it, and only its own stream's. TestLeaderElectionInAClusterIssuesLostWritesAgain has real elections; here
// the advisory is the test's.
func TestAckWaitsEndAtTheirStreamsElection(t *testing.T) {
	t.Parallel()
	b, _ := internalBroker(t)
	messages, locks, bodies := b.store.WriteStreams()
	watches := map[string]*ackWatch{messages: b.msgAcks, locks: b.lockAcks, bodies: b.bodyAcks}
	for stream, ends := range watches {
		waiting := ends.current()
		others := map[string]context.Context{}
		for s, w := range watches {
			if s != stream {
				others[s] = w.current()
			}
		}
		if err := b.cfg.Conn.Publish(leaderElected(stream), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-waiting.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("%s's election: the waits did not end", stream)
		}
		if err := context.Cause(waiting); !errors.Is(err, errAcksLost) || !strings.Contains(err.Error(), stream+" elected a leader") {
			t.Fatalf("%s's election: the waits ended with %v, want %v naming the stream", stream, err, errAcksLost)
		}
		if ends.current().Err() != nil {
			t.Fatalf("%s's election: the waits begun after it ended too", stream)
		}
		for s, other := range others {
			if other.Err() != nil {
				t.Fatalf("%s's election ended the waits of %s's writes", stream, s)
			}
		}
	}
}

// TestWriteNoServerTookIsIssuedAgainOnceOneMay: a record write that no server takes (no
// responders: its stream has no leader, as during an election; here, the stream is gone for a
// moment) stored nothing, so it is issued again, paced, until the stream is served again within
// the write timeout, rather than twice at once and then left in doubt: the enqueue succeeds.
func TestWriteNoServerTookIsIssuedAgainOnceOneMay(t *testing.T) {
	t.Parallel()
	logs := &recordedLogs{}
	b, _ := internalBrokerLogging(t, slog.New(logs))
	ctx := context.Background()
	q := queueQ(t, b)
	js, err := jetstream.New(b.cfg.Conn)
	if err != nil {
		t.Fatal(err)
	}
	messages, _, _ := b.store.WriteStreams()
	if err := js.DeleteStream(ctx, messages); err != nil {
		t.Fatal(err)
	}
	done := enqueueM(q)
	eventually(t, "the record's write refused for want of a leader", func() bool {
		for _, l := range logs.find(slog.LevelWarn, "message write outcome not known yet; issuing it again") {
			if strings.Contains(l["error"], kv.ErrNoLeader.Error()) {
				return true
			}
		}
		return false
	})
	// Without pacing, the write's three issues would be spent at once and the write left in doubt,
	// the enqueue failed. It must be issued more often than that and stay out of doubt meanwhile
	// (nothing else publishes on the broker's connection now: its clock is a fake one).
	from := b.cfg.Conn.Stats().OutMsgs
	eventually(t, "more issues of the write than its tries", func() bool {
		q.mu.Lock()
		doubts := q.doubts()
		q.mu.Unlock()
		if doubts > 0 {
			t.Fatal("the write that no server took was left in doubt")
		}
		return b.cfg.Conn.Stats().OutMsgs >= from+rewrites+2
	})
	if _, err := kv.Open(ctx, b.kvConfig(js, 1)); err != nil { // the stream again, empty
		t.Fatal(err)
	}
	storedM(t, b, done)
}

// TestElectionsDoNotSpendAWritesTries: a write whose acknowledgement never comes is issued again
// at each of its stream's elections without that counting among its tries, so however many come
// (up to electionIssues) it is not left in doubt; once the stream takes it, it lands. Here nothing
// stores the messages bucket's writes for a while, but a subscriber takes them in: they are
// neither stored nor refused, as a write a deposed leader dropped.
func TestElectionsDoNotSpendAWritesTries(t *testing.T) {
	t.Parallel()
	d := dropWrites(t, func(messages, _, _ string) string { return messages }, "$KV.natstone-messages.>")
	b, q, nc, js, messages, taken := d.b, d.q, d.nc, d.js, d.stream, d.taken
	ctx := context.Background()
	done := enqueueM(q)
	const elections = rewrites + 3 // more than a write's tries
	for i := range elections + 1 {
		if _, err := taken.NextMsg(30 * time.Second); err != nil {
			t.Fatalf("issue %d of the record's write: %v", i+1, err)
		}
		q.mu.Lock()
		doubts := q.doubts()
		q.mu.Unlock()
		if doubts > 0 {
			t.Fatalf("after %d elections the write is in doubt", i)
		}
		select {
		case err := <-done:
			t.Fatalf("after %d elections the enqueue ended: %v", i, err)
		default:
		}
		if i == elections {
			break
		}
		if err := nc.Publish(leaderElected(messages), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.Open(ctx, b.kvConfig(js, 1)); err != nil { // the stream again, empty
		t.Fatal(err)
	}
	if err := taken.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(leaderElected(messages), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	storedM(t, b, done)
}

// TestRefusedElectionAdvisoriesAreLogged: a broker whose NATS user may not subscribe to JetStream's
// advisories serves all the same, and says in its log that it then finds its streams' leader
// elections by asking (the server refuses a subscription after the fact).
func TestRefusedElectionAdvisoriesAreLogged(t *testing.T) {
	t.Parallel()
	srv := natstest.StartOptions(t, &server.Options{Users: []*server.User{{Username: "broker", Password: "pw",
		Permissions: &server.Permissions{Subscribe: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.EVENT.>"}}}}}})
	logs := &recordedLogs{}
	b := startedBroker(t, &Config{Conn: srv.Connect(t, nats.UserInfo("broker", "pw")), Clock: clock.NewFake(time.UnixMilli(1_700_000_000_000)),
		Logger: slog.New(logs)})
	ctx := context.Background()
	if got := logs.find(slog.LevelWarn, notTold); len(got) != 1 ||
		!strings.Contains(got[0]["error"], "LEADER_ELECTED") {
		t.Fatalf("the refusal's log: %v", got)
	}
	q := queueQ(t, b)
	if _, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "m"}}); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
}

// enqueueM enqueues message m into q on a goroutine of its own; the channel yields its error.
func enqueueM(q *queue) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := q.enqueue(context.Background(), []subjects.EnqueueRequest{{ID: "m", Payload: "p"}})
		done <- err
	}()
	return done
}

// storedM waits for enqueueM's end, and checks that it stored m, pending.
func storedM(t *testing.T, b *Broker, done <-chan error) {
	t.Helper()
	if err := waitOn(t, done); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	if r, _, err := b.store.GetMessage(context.Background(), "q", "m"); err != nil || r.State != subjects.StatePending {
		t.Fatalf("m in storage: %+v, %v; want it pending", r, err)
	}
}

// TestElectionIssuesEveryPayloadOfABatchAgain: an election of the payloads stream issues again
// every payload of an enqueue that waits for its acknowledgements, not only the one it was
// waiting for at that moment (the others once waited under the new leader's context, so past
// the election, for the write timeout). Here the payloads are taken in by a subscriber while the
// stream is gone, as a deposed leader would drop them.
func TestElectionIssuesEveryPayloadOfABatchAgain(t *testing.T) {
	t.Parallel()
	d := dropWrites(t, func(_, _, bodies string) string { return bodies }, "natstone.body.>")
	b, q, nc, js, bodies, taken := d.b, d.q, d.nc, d.js, d.stream, d.taken
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := q.enqueue(ctx, []subjects.EnqueueRequest{{ID: "m", Payload: "p"}, {ID: "n", Payload: "p"}})
		done <- err
	}()
	for i := range 2 {
		if _, err := taken.NextMsg(30 * time.Second); err != nil {
			t.Fatalf("payload %d: %v", i+1, err)
		}
	}
	if _, err := kv.Open(ctx, b.kvConfig(js, 1)); err != nil { // the stream again, empty
		t.Fatal(err)
	}
	if err := taken.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(leaderElected(bodies), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := waitOn(t, done); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	for _, id := range []string{"m", "n"} {
		r, _, err := b.store.GetMessage(ctx, "q", id)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if p, err := b.store.GetBody(ctx, r.BodySeq); err != nil || string(p) != "p" {
			t.Fatalf("%s's payload: %q, %v", id, p, err)
		}
	}
}

// droppedWrites is a broker (its write timeout a minute) with queue q, whose stream of one kind of
// writes is gone while a subscriber of the test's takes those writes in, unanswered, as a deposed
// leader drops them.
type droppedWrites struct {
	b      *Broker
	q      *queue
	nc     *nats.Conn // the test's
	js     jetstream.JetStream
	stream string             // the stream gone
	taken  *nats.Subscription // on subject: the writes meant for stream
}

// dropWrites returns a droppedWrites whose stream is the one of WriteStreams that pick names, its
// writes sent on subject.
func dropWrites(t *testing.T, pick func(messages, locks, bodies string) string, subject string) *droppedWrites {
	t.Helper()
	srv := natstest.Start(t, nil)
	d := &droppedWrites{nc: srv.Connect(t)}
	d.b = startedBroker(t, &Config{Conn: srv.Connect(t), Clock: clock.NewFake(time.UnixMilli(1_700_000_000_000)),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WriteTimeout: time.Minute})
	ctx := context.Background()
	var err error
	d.q = queueQ(t, d.b)
	if d.js, err = jetstream.New(d.nc); err != nil {
		t.Fatal(err)
	}
	d.stream = pick(d.b.store.WriteStreams())
	if err := d.js.DeleteStream(ctx, d.stream); err != nil {
		t.Fatal(err)
	}
	if d.taken, err = d.nc.SubscribeSync(subject); err != nil {
		t.Fatal(err)
	}
	if err := d.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestLongWaitsAreThoseBegunBeforeTheTickBefore: checkLeaders asks a stream who leads it only while
// one of its writes has waited since before the previous tick: not for a write begun in the
// current tick, nor once the write is answered (here, given up).
func TestLongWaitsAreThoseBegunBeforeTheTickBefore(t *testing.T) {
	t.Parallel()
	d := dropWrites(t, func(_, _, bodies string) string { return bodies }, "natstone.body.>")
	w := newAckWatch()
	if w.longWaits() {
		t.Fatal("a long wait with no write")
	}
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := w.wait(ctx, w.current(), d.b.store.WriteBody("q", "m", []byte("p")))
		waited <- err
	}()
	eventually(t, "the write's wait to begin", func() bool { return w.waiting.Load().n.Load() == 1 })
	if w.longWaits() {
		t.Fatal("a wait begun in the current tick is long")
	}
	for range 2 {
		if !w.longWaits() {
			t.Fatal("a wait begun before the previous tick is not long")
		}
	}
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("the wait ended with %v, want it given up", err)
	}
	if w.longWaits() {
		t.Fatal("a long wait once the write's wait ended")
	}
}

// TestAskedLeaderEndsWaitsOnlyForAnotherElection: a leader found by asking ends the waits only
// when it is another than the last known, found by asking or named by an advisory (its time of
// election unknown then, but not after the advisory was sent); an answer that may be older than
// what the watch knows is not taken. Without leader_since (nats-server 2.11) the names tell.
func TestAskedLeaderEndsWaitsOnlyForAnotherElection(t *testing.T) {
	t.Parallel()
	t1 := time.UnixMilli(1_700_000_000_000)
	t2 := t1.Add(5 * time.Second)
	s1, s2 := kv.Leader{Name: "s1", Since: t1}, kv.Leader{Name: "s2", Since: t2}
	told := t2.Add(10 * time.Millisecond) // s2's advisory
	for _, c := range []struct {
		name       string
		was        kv.Leader
		before     string
		toldAt     time.Time
		now        kv.Leader
		endedSince bool // the waits were ended after the question was asked
		ends       bool
		known      kv.Leader // afterwards
	}{
		{name: "the same", was: s1, now: s1, known: s1},
		{name: "another server", was: s1, now: s2, ends: true, known: s2},
		{name: "the same elected again", was: s1, now: kv.Leader{Name: "s1", Since: t2}, ends: true, known: kv.Leader{Name: "s1", Since: t2}},
		{name: "an old leader still answering", was: s2, before: "s1", now: s1, known: s2},
		{name: "no leader yet", was: s1, now: kv.Leader{}, known: s1},
		{name: "none known before", now: s2, known: s2},
		{name: "outside a cluster", was: kv.Leader{Name: "n"}, now: kv.Leader{Name: "n"}, known: kv.Leader{Name: "n"}},
		{name: "ended while asked", was: s1, now: s2, endedSince: true, known: s1},
		{name: "the election told", was: kv.Leader{Name: "s2"}, toldAt: told, now: s2, known: s2},
		{name: "another than told", was: kv.Leader{Name: "s2"}, toldAt: told, now: kv.Leader{Name: "s3", Since: t2.Add(time.Second)}, ends: true, known: kv.Leader{Name: "s3", Since: t2.Add(time.Second)}},
		{name: "the one told elected again", was: kv.Leader{Name: "s2"}, toldAt: told, now: kv.Leader{Name: "s2", Since: t2.Add(4 * time.Second)}, ends: true, known: kv.Leader{Name: "s2", Since: t2.Add(4 * time.Second)}},
		{name: "an old leader answering after one told", was: kv.Leader{Name: "s2"}, toldAt: told, now: s1, known: kv.Leader{Name: "s2"}},
		{name: "2.11: another", was: kv.Leader{Name: "s1"}, now: kv.Leader{Name: "s2"}, ends: true, known: kv.Leader{Name: "s2"}},
		{name: "2.11: the leader before, still answering", was: kv.Leader{Name: "s2"}, before: "s1", now: kv.Leader{Name: "s1"}, known: kv.Leader{Name: "s2"}},
		{name: "2.11: another than told", was: kv.Leader{Name: "s2"}, before: "s1", toldAt: told, now: kv.Leader{Name: "s3"}, ends: true, known: kv.Leader{Name: "s3"}},
		{name: "the same, one answer without its time", was: s1, now: kv.Leader{Name: "s1"}, known: kv.Leader{Name: "s1"}},
		{name: "the same, the time back", was: kv.Leader{Name: "s1"}, now: s1, known: s1},
	} {
		w := newAckWatch()
		w.leader, w.before, w.toldAt = c.was, c.before, c.toldAt
		waits, ends := w.current(), w.generation()
		if c.endedSince {
			w.ended(errAcksLost)
			waits = w.current()
		}
		if got := w.asked(c.now, ends, errAcksLost); got != c.ends || (waits.Err() != nil) != c.ends {
			t.Errorf("%s: asked %+v after %+v: ended %v (the waits' context: %v), want %v", c.name, c.now, c.was, got, waits.Err(), c.ends)
		}
		if w.leader != c.known {
			t.Errorf("%s: asked %+v after %+v: known as %+v, want %+v", c.name, c.now, c.was, w.leader, c.known)
		}
	}
}

// TestOldAndNewLeadersAnsweringInTurnEndTheWaitsOnce: while a leader cut off from its peers still
// answers for its stream, as the new one does, answers from both in turn end the waits once, for
// the new leader's election, with leader_since or without it (nats-server 2.11), told of the
// election or not.
func TestOldAndNewLeadersAnsweringInTurnEndTheWaitsOnce(t *testing.T) {
	t.Parallel()
	t1 := time.UnixMilli(1_700_000_000_000)
	t2 := t1.Add(5 * time.Second)
	for _, c := range []struct {
		name     string
		old, new kv.Leader
		told     bool
	}{
		{"leader_since", kv.Leader{Name: "s1", Since: t1}, kv.Leader{Name: "s2", Since: t2}, false},
		{"leader_since, told", kv.Leader{Name: "s1", Since: t1}, kv.Leader{Name: "s2", Since: t2}, true},
		{"2.11", kv.Leader{Name: "s1"}, kv.Leader{Name: "s2"}, false},
		{"2.11, told", kv.Leader{Name: "s1"}, kv.Leader{Name: "s2"}, true},
	} {
		w := newAckWatch()
		w.asked(c.old, w.generation(), errAcksLost) // the first known
		ended := 0
		if c.told && w.told(c.new.Name, t2.Add(10*time.Millisecond), errAcksLost) {
			ended++
		}
		for range 5 {
			for _, l := range []kv.Leader{c.new, c.old} {
				if w.asked(l, w.generation(), errAcksLost) {
					ended++
				}
			}
		}
		if ended != 1 || w.leader.Name != c.new.Name {
			t.Errorf("%s: the waits were ended %d times, want once; the leader known is %+v, want %s", c.name, ended, w.leader, c.new.Name)
		}
	}
}

// TestToldElectionEndsWaitsUnlessAskingFoundIt: an advisory ends the waits, unless asking found
// its election first and ended them then (a new leader answers for its stream a moment before it
// sends the advisory), or the same advisory came before.
func TestToldElectionEndsWaitsUnlessAskingFoundIt(t *testing.T) {
	t.Parallel()
	t1 := time.UnixMilli(1_700_000_000_000)
	s1, s2 := kv.Leader{Name: "s1", Since: t1.Add(-time.Minute)}, kv.Leader{Name: "s2", Since: t1}
	for _, c := range []struct {
		name   string
		asked  []kv.Leader // the answers before the advisory
		leader string
		at     time.Time
		ends   bool
		known  kv.Leader // afterwards
	}{
		{name: "found by asking", asked: []kv.Leader{s1, s2}, leader: "s2", at: t1.Add(10 * time.Millisecond), known: s2},
		{name: "only learnt by asking", asked: []kv.Leader{s2}, leader: "s2", at: t1.Add(10 * time.Millisecond), ends: true, known: kv.Leader{Name: "s2"}},
		{name: "another server", asked: []kv.Leader{s1}, leader: "s2", at: t1.Add(10 * time.Millisecond), ends: true, known: kv.Leader{Name: "s2"}},
		{name: "found, then elected again", asked: []kv.Leader{s1, s2}, leader: "s2", at: t1.Add(5 * time.Second), ends: true, known: kv.Leader{Name: "s2"}},
		{name: "nothing known", leader: "s2", at: t1, ends: true, known: kv.Leader{Name: "s2"}},
		{name: "without leader or time", asked: []kv.Leader{s1, s2}, ends: true, known: s2},
	} {
		w := newAckWatch()
		for _, l := range c.asked {
			w.asked(l, w.generation(), errAcksLost)
		}
		waits := w.current()
		if got := w.told(c.leader, c.at, errAcksLost); got != c.ends || (waits.Err() != nil) != c.ends {
			t.Errorf("%s: ended %v (the waits' context: %v), want %v", c.name, got, waits.Err(), c.ends)
		}
		if w.leader != c.known {
			t.Errorf("%s: known as %+v, want %+v", c.name, w.leader, c.known)
		}
	}
	// The same advisory again ends nothing more.
	w := newAckWatch()
	if !w.told("s2", t1, errAcksLost) {
		t.Fatal("an advisory ended nothing")
	}
	if waits := w.current(); w.told("s2", t1, errAcksLost) || waits.Err() != nil {
		t.Fatal("the same advisory again ended the waits again")
	}
}

// TestLeaderAskedEveryTickUntilKnown: a stream whose leader is not known (here, one that does not
// exist yet) is asked for it at every tick, not only once a write has waited, until it answers.
func TestLeaderAskedEveryTickUntilKnown(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	b := startedBroker(t, &Config{Conn: srv.Connect(t), Clock: clock.NewFake(time.UnixMilli(1_700_000_000_000)),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WriteTimeout: 2 * time.Second})
	const stream = "LATER"
	nc := srv.Connect(t)
	asks, err := nc.SubscribeSync("$JS.API.STREAM.INFO." + stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	w := newAckWatch()
	w.stream = stream
	b.wg.Add(1) // Stop, at the test's end, waits for it
	go func() {
		defer b.wg.Done()
		b.checkLeaders(w)
	}()
	for i := range 3 {
		if _, err := asks.NextMsg(30 * time.Second); err != nil {
			t.Fatalf("ask %d of a stream without a leader: %v", i+1, err)
		}
	}
	if !w.unknown() {
		t.Fatal("a leader known of a stream that does not exist")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: stream, Subjects: []string{"later"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the stream's leader to be known", func() bool { return !w.unknown() })
	if w.mu.Lock(); w.leader.Name != srv.NATS().Name() {
		t.Errorf("the leader known: %q, want the server, %q", w.leader.Name, srv.NATS().Name())
	}
	w.mu.Unlock()
}

// TestReadAskedAgainAtItsStreamsElection: a read waited for under a stream's watch (a payload's)
// counts among the waits checkLeaders looks at, and is run again when the stream elects a leader,
// as a write is issued again, or when a try is unanswered for its time: one the old leader took,
// or that nobody answered while there was none, is answered by nobody. A read that fails of
// itself, or whose ctx ends, is not run again.
func TestReadAskedAgainAtItsStreamsElection(t *testing.T) {
	t.Parallel()
	w := newAckWatch()
	calls := make(chan int, 3)
	var n int
	var data string
	get := func(ctx context.Context) error {
		n++
		calls <- n
		if n == 1 {
			<-ctx.Done() // lost: never answered
			return context.Cause(ctx)
		}
		data = "p"
		return nil
	}
	done := make(chan string, 1)
	go func() {
		if err := w.read(context.Background(), time.Hour, get); err != nil {
			t.Errorf("read: %v", err)
		}
		done <- data
	}()
	if got := waitOn(t, calls); got != 1 {
		t.Fatalf("call %d, want the first", got)
	}
	eventually(t, "the read to count among the waits", func() bool { return w.waiting.Load().n.Load() == 1 })
	w.told("s2", time.UnixMilli(1_700_000_000_000), errAcksLost)
	if got := waitOn(t, calls); got != 2 {
		t.Fatalf("call %d after the election, want the second", got)
	}
	if data := waitOn(t, done); data != "p" {
		t.Fatalf("read %q, want p", data)
	}
	if w.waiting.Load().n.Load() != 0 {
		t.Fatal("the read still counts among the waits once answered")
	}

	failed := errors.New("no such payload")
	n = 0
	if err := w.read(context.Background(), time.Hour, func(context.Context) error { n++; return failed }); !errors.Is(err, failed) || n != 1 {
		t.Fatalf("a failed read: %v after %d calls, want its error after 1", err, n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n = 0
	if err := w.read(ctx, time.Hour, func(ctx context.Context) error { n++; return ctx.Err() }); !errors.Is(err, context.Canceled) || n != 1 {
		t.Fatalf("a read given up: %v after %d calls, want canceled after 1", err, n)
	}

	// Unanswered for its time, without an election: made again, with twice the time each time
	// (a server slow to answer is not asked ever more often).
	n = 0
	var tries []time.Duration
	err := w.read(context.Background(), 10*time.Millisecond, func(ctx context.Context) error {
		deadline, _ := ctx.Deadline()
		tries = append(tries, time.Until(deadline))
		if n++; n <= 2 {
			<-ctx.Done()
			return context.Cause(ctx)
		}
		data = "q"
		return nil
	})
	if err != nil || data != "q" || n != 3 {
		t.Fatalf("a read unanswered for its time: %q, %v after %d calls, want q after 3", data, err, n)
	}
	if tries[1] <= 10*time.Millisecond || tries[2] <= 20*time.Millisecond {
		t.Fatalf("tries of %v, want each unanswered try's time doubled from 10ms", tries)
	}
}
