package broker_test

import (
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/broker/clock"
	"github.com/natstone/natstone/kv"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/natstest"
)

// t0 is the fake clock's start: a round Unix-ms time so expectations are easy to read.
var t0 = time.UnixMilli(1_700_000_000_000).UTC()

// env is one test's natstone: an in-process JetStream server, a broker on a fake clock, and a client
// connection.
type env struct {
	t     *testing.T
	srv   *natstest.Server
	nc    *nats.Conn
	clk   *clock.Fake
	b     *broker.Broker
	cfg   broker.Config
	space subjects.Space
}

// setup starts a server and a broker; mod may adjust the broker config before it starts.
func setup(t *testing.T, mod ...func(*broker.Config)) *env {
	t.Helper()
	return setupOn(t, nil, mod...)
}

// setupOn is setup on a server started with opts.
func setupOn(t *testing.T, opts *natstest.Options, mod ...func(*broker.Config)) *env {
	t.Helper()
	e := &env{t: t, srv: natstest.Start(t, opts), clk: clock.NewFake(t0)}
	e.nc = e.srv.Connect(t)
	e.cfg = broker.Config{
		Conn:   e.srv.Connect(t),
		Clock:  e.clk,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, m := range mod {
		m(&e.cfg)
	}
	var err error
	if e.space, err = subjects.NewSpace(e.cfg.Prefix); err != nil {
		t.Fatal(err)
	}
	e.startBroker()
	return e
}

func (e *env) startBroker() {
	e.t.Helper()
	b, err := broker.New(&e.cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		e.t.Fatalf("start broker: %v", err)
	}
	e.b = b
	e.t.Cleanup(func() { e.stopBroker(b) })
}

func (e *env) stopBroker(b *broker.Broker) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Stop(ctx); err != nil {
		e.t.Errorf("stop broker: %v", err)
	}
}

// restartBroker stops the broker and starts a new one on the same storage (NATS keeps running).
func (e *env) restartBroker() {
	e.t.Helper()
	e.stopBroker(e.b)
	e.startBroker()
}

// cleanRestarts runs test, in parallel subtests, with each way of restarting cleanly: the broker
// alone (restartBroker), and the broker with the NATS server (restartAll).
func cleanRestarts(t *testing.T, test func(t *testing.T, restart func(e *env))) {
	for name, restart := range map[string]func(e *env){
		"broker only":     (*env).restartBroker,
		"broker and NATS": (*env).restartAll,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, restart)
		})
	}
}

// restartAll stops the broker and the NATS server, then starts both again on the same data dir.
func (e *env) restartAll() {
	e.t.Helper()
	e.stopBroker(e.b)
	e.srv = e.srv.Restart(e.t)
	e.nc = e.srv.Connect(e.t)
	e.cfg.Conn = e.srv.Connect(e.t)
	e.startBroker()
}

// events subscribes to the events on subject (a filter such as "natstone.events.q.released.>")
// until the test ends, and returns the channel they arrive on.
func (e *env) events(subject string) <-chan *nats.Msg {
	e.t.Helper()
	ch := make(chan *nats.Msg, 64)
	sub, err := e.nc.ChanSubscribe(subject, ch)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := e.nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
	return ch
}

// jetStream returns a JetStream context on the test's own connection.
func (e *env) jetStream() jetstream.JetStream {
	e.t.Helper()
	js, err := jetstream.New(e.nc)
	if err != nil {
		e.t.Fatal(err)
	}
	return js
}

// storeRaw publishes data on subject as it is, behind the broker's back: a record or lock that
// natstone would not write ("$KV.natstone-messages." + kv.MessageKey(…), "$KV.natstone-locks." +
// kv.LockKey(…)).
func (e *env) storeRaw(subject string, data []byte) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.jetStream().Publish(ctx, subject, data); err != nil {
		e.t.Fatal(err)
	}
}

// storeLock writes slot of value's lock in queue behind the broker's back, naming holder under
// lease, as another writer (a broker that lost the store) would.
func (e *env) storeLock(queue, value string, slot int, holder, lease string) {
	e.t.Helper()
	e.storeRaw("$KV.natstone-locks."+kv.SlotKey(queue, value, slot), kv.EncodeLock(kv.Lock{MessageID: holder, LeaseID: lease}))
}

// waitNoKeys waits, up to 10 s, until stream holds no subject matching filter: a removed record's
// purge marker stays a second (its TTL, on the server's clock).
func (e *env) waitNoKeys(stream, filter string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		st, err := e.jetStream().Stream(ctx, stream)
		if err != nil {
			e.t.Fatal(err)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			e.t.Fatal(err)
		}
		if len(info.State.Subjects) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			e.t.Fatalf("%s still holds %v", stream, info.State.Subjects)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// waitStreamMsgs waits, up to 10 s, until stream holds n messages.
func (e *env) waitStreamMsgs(stream string, n uint64) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js := e.jetStream()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var msgs uint64
	for {
		st, err := js.Stream(ctx, stream)
		switch {
		case err == nil:
			if msgs = st.CachedInfo().State.Msgs; msgs == n {
				return
			}
		case ctx.Err() == nil:
			e.t.Fatal(err)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			e.t.Fatalf("stream %s holds %d messages, want %d", stream, msgs, n)
		}
	}
}

// restartAllUnclean is restartAll as after an unclean stop of the server: before it starts again,
// the streams' state files (index.db, thw.db) go, so the server rebuilds every block from what it
// holds, as it does for the blocks written after its last state file when it was killed.
func (e *env) restartAllUnclean() {
	e.t.Helper()
	e.stopBroker(e.b)
	e.srv.Shutdown()
	err := filepath.WalkDir(e.srv.StoreDir(), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (d.Name() == "index.db" || d.Name() == "thw.db") {
			err = os.Remove(path)
		}
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.srv = e.srv.Restart(e.t)
	e.nc = e.srv.Connect(e.t)
	e.cfg.Conn = e.srv.Connect(e.t)
	e.startBroker()
}

// request sends body (marshalled unless it is []byte) to op on queue and returns the raw reply.
func (e *env) request(op subjects.Op, queue string, body any) *nats.Msg {
	e.t.Helper()
	var data []byte
	switch v := body.(type) {
	case nil:
	case []byte:
		data = v
	case string:
		data = []byte(v)
	default:
		var err error
		if data, err = json.Marshal(v); err != nil {
			e.t.Fatal(err)
		}
	}
	msg, err := e.nc.Request(e.space.Subject(op, queue), data, 10*time.Second)
	if err != nil {
		e.t.Fatalf("%s %s: %v", op, queue, err)
	}
	return msg
}

// call sends a request and decodes its reply into T, or returns the typed error it carried.
func call[T any](e *env, op subjects.Op, queue string, body any) (T, *subjects.Error) {
	e.t.Helper()
	return decodeReply[T](e.t, e.request(op, queue, body))
}

func decodeReply[T any](t *testing.T, msg *nats.Msg) (T, *subjects.Error) {
	t.Helper()
	var out T
	if code := msg.Header.Get("Nats-Service-Error-Code"); code != "" {
		var er subjects.ErrorReply
		if err := json.Unmarshal(msg.Data, &er); err != nil || er.Error == nil {
			t.Fatalf("error reply %s with undecodable body %q: %v", code, msg.Data, err)
		}
		if want := er.Error.Code.Status(); code != strconv.Itoa(want) {
			t.Fatalf("error %s sent with status %s, want %d", er.Error.Code, code, want)
		}
		return out, er.Error
	}
	if err := json.Unmarshal(msg.Data, &out); err != nil {
		t.Fatalf("reply %q: %v", msg.Data, err)
	}
	return out, nil
}

// must is call that fails the test on an error reply.
func must[T any](e *env, op subjects.Op, queue string, body any) T {
	e.t.Helper()
	out, err := call[T](e, op, queue, body)
	if err != nil {
		e.t.Fatalf("%s %s: %v", op, queue, err)
	}
	return out
}

// fails is call that expects an error reply with code.
func fails(e *env, code subjects.Code, op subjects.Op, queue string, body any) *subjects.Error {
	e.t.Helper()
	_, err := call[json.RawMessage](e, op, queue, body)
	if err == nil {
		e.t.Fatalf("%s %s: succeeded, want %s", op, queue, code)
	}
	if err.Code != code {
		e.t.Fatalf("%s %s: got %s (%s), want %s", op, queue, err.Code, err.Message, code)
	}
	return err
}

func (e *env) create(queue string, r subjects.CreateQueueRequest) subjects.QueueInfo {
	e.t.Helper()
	return must[subjects.QueueInfo](e, subjects.OpCreate, queue, r)
}

func (e *env) enqueue(queue string, r subjects.EnqueueRequest) subjects.EnqueueReply {
	e.t.Helper()
	return must[subjects.EnqueueReply](e, subjects.OpEnqueue, queue, r)
}

// enqueueInOrder enqueues messages ids to queue with priorities 0, 1, …: the order they dequeue in.
func (e *env) enqueueInOrder(queue string, ids ...string) {
	e.t.Helper()
	for i, id := range ids {
		e.enqueue(queue, subjects.EnqueueRequest{ID: id, Priority: ptr(int64(i))})
	}
}

func (e *env) dequeue(queue string, r subjects.DequeueRequest) []subjects.Message {
	e.t.Helper()
	return must[subjects.DequeueReply](e, subjects.OpDequeue, queue, r).Messages
}

func (e *env) dequeueOne(queue string) subjects.Message {
	e.t.Helper()
	ms := e.dequeue(queue, subjects.DequeueRequest{})
	if len(ms) != 1 {
		e.t.Fatalf("dequeue %s: got %d messages, want 1", queue, len(ms))
	}
	return ms[0]
}

func (e *env) get(queue, id string) subjects.Message {
	e.t.Helper()
	return must[subjects.Message](e, subjects.OpGet, queue, subjects.GetRequest{ID: id})
}

func (e *env) depth(queue string, filter map[string]string) subjects.Counts {
	e.t.Helper()
	return must[subjects.DepthReply](e, subjects.OpDepth, queue, subjects.DepthRequest{Filter: filter}).Counts
}

// advance moves the fake clock; the broker's timer callbacks run (and their writes land) before it
// returns.
func (e *env) advance(d time.Duration) { e.clk.Advance(d) }

func ptr[T any](v T) *T { return &v }

// ids returns the ids of ms in order.
func ids(ms []subjects.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

func natsMsg(subject string, data []byte, headers map[string]string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = data
	for k, v := range headers {
		m.Header.Set(k, v)
	}
	return m
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
