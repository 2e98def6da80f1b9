package broker_test

// A model-based randomized test of the broker's user-visible semantics (TestModel): from a seeded
// math/rand it runs random operations on two or three queues — a simple one (with or without
// max_running and a queue invisibility), an exclusive one (max_running_per_value 1 or 2), and
// sometimes a second exclusive one with max_running — and checks every reply, and the state after
// every step, against a plain in-memory reference model written from docs/protocol.md (where the
// docs leave a rule open, the model follows broker/*.go, and says so).
//
// The model covers: enqueue, enqueue_batch and enqueue_raw (ids from a small pool, so duplicates
// are frequent; priorities with ties, near the default, or the default; metadata; invisible_ms and
// visible_at, a fraction of a millisecond rounded up; max_attempts and lease_ms; invalid ones);
// dequeue (batches, filters, lease_ms, request ids and their retries, EDF order with ties in
// enqueue order, exclusivity and max_running), long polls (parked, served in arrival order, timed
// out, abandoned, ended by a queue's delete or a broker's stop), a dequeue whose reply reaches
// nobody (its leases given back); extend, complete, release (delay, refund) and cancel (holder's
// and operator's, with a version) with the current, a stale or a bogus lease, repeated, and with a
// next (and its retry with a request id); abandon; retry; reschedule; update (blocked flags,
// limits, lease, attempts, lowered payload and metadata limits); delete and create again; the fake
// clock's advances (invisibility ends, lease expiries into pending or errored, collections after
// retention with their documented 100 ms slack); restarts of the broker, of the broker with NATS,
// and of NATS uncleanly. Checked: every reply (its error code, or each message in it field by field), depth (with
// and without filters) after every step, get of every id and history (events, versions, failures,
// current) every 50 steps and after each restart, browse order, stats (counts, oldest pending,
// expiring leases).
//
// Replay a seed with NATSTONE_MODEL_SEED=<n> (or "random" for a new one, logged); change how many
// seeds and operations with NATSTONE_MODEL_SEEDS (default 3) and NATSTONE_MODEL_OPS (default 400).
// NATSTONE_MODEL_DEBUG=1 logs the lock slots when a restart moved a version.
//
//	NATSTONE_MODEL_SEED=17 NATSTONE_MODEL_OPS=3000 go test -race -run '^TestModel$' -count=1 -v ./broker/

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/subjects"
)

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

// TestModel runs the model for a few seeds (NATSTONE_MODEL_SEED for one, NATSTONE_MODEL_SEEDS for
// how many, NATSTONE_MODEL_OPS for each run's length).
func TestModel(t *testing.T) {
	var seeds []int64
	switch v := os.Getenv("NATSTONE_MODEL_SEED"); v {
	case "":
		for i := range envInt(t, "NATSTONE_MODEL_SEEDS", 3) {
			seeds = append(seeds, int64(i+1))
		}
	case "random":
		seeds = []int64{time.Now().UnixNano() % 1_000_000_007}
	default:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("NATSTONE_MODEL_SEED=%q: %v", v, err)
		}
		seeds = []int64{n}
	}
	ops := envInt(t, "NATSTONE_MODEL_OPS", 400)
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Logf("seed %d, %d operations (replay: NATSTONE_MODEL_SEED=%d NATSTONE_MODEL_OPS=%d)", seed, ops, seed, ops)
			runModel(t, seed, ops)
		})
	}
}

// ---- the model ----

const (
	modelIDs    = 14 // ids m00..m13 per queue: enqueues of the same id are frequent
	gcSlackMS   = 100
	ridWindowMS = int64(5 * time.Minute / time.Millisecond)
)

type lref struct{ id, lease string }

// mm is a message as the model holds it: the fields of its stored record that replies show.
type mm struct {
	id          string
	state       subjects.State
	prio        int64
	seq         int64 // enqueue order (the broker's payload sequence)
	md          map[string]string
	payload     string
	version     uint64
	attempts    int
	maxAttempts int
	leaseMS     int64 // the message's own lease, 0: the queue's
	leaseID     string
	leaseExp    int64
	visibleAt   int64
	enqueuedAt  int64
	updatedAt   int64
	endedAt     int64
	released    bool   // its last lease ended by a release
	rid         string // the request id of its last lease's dequeue, until that lease is used
	leases      []string
	events      []mev
}

// mreq is a remembered dequeue request id.
type mreq struct {
	leases   []lref
	until    int64
	gaveUp   bool     // abandoned: a dequeue with the id leases nothing
	released []string // what abandons of the id gave back
	settled  *msettled
	inFlight bool // its dequeue is parked: abandon ends it
}

// msettled is the settle whose next a remembered dequeue was: a retry of it gets its reply back.
type msettled struct {
	op        subjects.Op
	id, lease string
	reply     subjects.Message // the settle's reply
	x         *mm              // the message (as it is now, or as it was when collected)
}

type mq struct {
	name    string
	cfg     subjects.QueueConfig
	msgs    map[string]*mm
	reqs    map[string]*mreq
	seq     int64
	rids    []string         // recent request ids, for retries
	history map[string][]mev // the events of collected messages whose id was not enqueued again
	widened int              // enqueues of stored ids let through lowered limits
}

type model struct {
	t     *testing.T
	e     *env
	rng   *rand.Rand
	seed  int64
	qs    []*mq
	log   []string
	step  int
	ridN  int
	payN  int
	filts []map[string]string
	// restartAt is when the broker last started; advanced says whether the clock moved since
	// (a collection overdue at a start runs at the next advance).
	restartAt int64
	advanced  bool
	restarts  int
	// ties holds, for the advance just made, each queue's states between its timers that fired at
	// its end: invisibility ends first (leases still running) or lease ends first (messages still
	// invisible). A poll parked there may be served between them.
	ties        map[*mq][]map[*mm]subjects.State
	locksBefore string
	creates     []subjects.CreateQueueRequest // each queue's create, by index in qs
	lastSettle  *lastSettle
	waiters     []*mwaiter // long polls parked at the broker, in arrival order
	stats       map[string]int
}

func (m *model) now() int64 { return m.e.clk.Now().UnixMilli() }

func (m *model) logf(format string, args ...any) {
	s := fmt.Sprintf("#%d t+%d: ", m.step, m.now()-t0.UnixMilli()) + fmt.Sprintf(format, args...)
	m.log = append(m.log, s)
	if len(m.log) > 120 {
		m.log = m.log[len(m.log)-120:]
	}
}

func (m *model) failf(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("MODEL DISCREPANCY (seed %d, step %d): %s\n--- recent operations (replay: NATSTONE_MODEL_SEED=%d) ---\n%s",
		m.seed, m.step, fmt.Sprintf(format, args...), m.seed, strings.Join(m.log, "\n"))
}

func js(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// ordered returns q's message ids in enqueue order: deterministic for a seed, as generated ids
// (the broker's) are not.
func (q *mq) ordered() []string {
	xs := slices.Collect(maps.Values(q.msgs))
	slices.SortFunc(xs, func(a, b *mm) int { return int(a.seq - b.seq) })
	return mmIDs(xs)
}

// addRid keeps rid among the recent request ids that dequeues and abandons reuse.
func (q *mq) addRid(rid string) {
	if !slices.Contains(q.rids, rid) {
		q.rids = append(q.rids, rid)
		if len(q.rids) > 8 {
			q.rids = q.rids[1:]
		}
	}
}

func (q *mq) exclusive() bool { return q.cfg.Type == subjects.Exclusive }

func (q *mq) perValue() int { return max(q.cfg.MaxRunningPerValue, 1) }

// view is the reply's view of x, as the broker's queue.view builds it.
func (q *mq) view(x *mm) subjects.Message {
	v := subjects.Message{
		ID: x.id, Queue: q.name, State: x.state, Priority: x.prio, Metadata: x.md, Version: x.version,
		Attempts: x.attempts, AttemptsLeft: max(x.maxAttempts-x.attempts, 0), LeaseID: x.leaseID,
		EnqueuedAt: time.UnixMilli(x.enqueuedAt).UTC(), VisibleAt: time.UnixMilli(x.visibleAt).UTC(),
		UpdatedAt: time.UnixMilli(x.updatedAt).UTC(),
	}
	if x.state == subjects.StateRunning {
		t := time.UnixMilli(x.leaseExp).UTC()
		v.LeaseExpiresAt = &t
	}
	if x.endedAt != 0 {
		t := time.UnixMilli(x.endedAt).UTC()
		v.EndedAt = &t
	}
	return v
}

func tms(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return strconv.FormatInt(t.UnixMilli()-t0.UnixMilli(), 10)
}

// diffMsg lists the fields in which got differs from want (payload too when withPayload).
func diffMsg(want subjects.Message, got subjects.Message, payload string, withPayload bool) string {
	var d []string
	f := func(name string, w, g any) {
		if fmt.Sprint(w) != fmt.Sprint(g) {
			d = append(d, fmt.Sprintf("%s: want %v, got %v", name, w, g))
		}
	}
	f("id", want.ID, got.ID)
	f("queue", want.Queue, got.Queue)
	f("state", want.State, got.State)
	f("priority", want.Priority, got.Priority)
	if !maps.Equal(want.Metadata, got.Metadata) {
		d = append(d, fmt.Sprintf("metadata: want %v, got %v", want.Metadata, got.Metadata))
	}
	f("version", want.Version, got.Version)
	f("attempts", want.Attempts, got.Attempts)
	f("attempts_left", want.AttemptsLeft, got.AttemptsLeft)
	f("lease_id", want.LeaseID, got.LeaseID)
	f("lease_expires_at(t+ms)", tms(want.LeaseExpiresAt), tms(got.LeaseExpiresAt))
	f("enqueued_at(t+ms)", tms(&want.EnqueuedAt), tms(&got.EnqueuedAt))
	f("visible_at(t+ms)", tms(&want.VisibleAt), tms(&got.VisibleAt))
	f("updated_at(t+ms)", tms(&want.UpdatedAt), tms(&got.UpdatedAt))
	f("ended_at(t+ms)", tms(want.EndedAt), tms(got.EndedAt))
	if withPayload {
		g := "<none>"
		if got.Payload != nil {
			g = *got.Payload
		} else if got.PayloadBase64 != nil {
			g = "b64:" + string(got.PayloadBase64)
		}
		f("payload", payload, g)
	} else if got.Payload != nil || got.PayloadBase64 != nil {
		d = append(d, "payload: present in a reply that carries none")
	}
	return strings.Join(d, "; ")
}

func (m *model) checkMsg(what string, q *mq, x *mm, got subjects.Message, withPayload bool) {
	m.t.Helper()
	if d := diffMsg(q.view(x), got, x.payload, withPayload); d != "" {
		m.failf("%s %s/%s: %s", what, q.name, x.id, d)
	}
}

func codeOf(err *subjects.Error) subjects.Code {
	if err == nil {
		return ""
	}
	return err.Code
}

func (m *model) checkCode(what string, want subjects.Code, got *subjects.Error) {
	m.t.Helper()
	if codeOf(got) != want {
		w := string(want)
		if w == "" {
			w = "success"
		}
		g := "success"
		if got != nil {
			g = fmt.Sprintf("%s (%s)", got.Code, got.Message)
		}
		m.failf("%s: want %s, got %s", what, w, g)
	}
}

// counts is the model's depth of q, of the messages matching filter.
func (q *mq) counts(filter map[string]string) subjects.Counts {
	var c subjects.Counts
	for _, x := range q.msgs {
		if !matchAll(x.md, filter) {
			continue
		}
		switch x.state {
		case subjects.StateInvisible:
			c.Invisible++
		case subjects.StatePending:
			c.Pending++
		case subjects.StateRunning:
			c.Running++
		case subjects.StateCompleted:
			c.Completed++
		case subjects.StateCanceled:
			c.Canceled++
		case subjects.StateErrored:
			c.Errored++
		}
	}
	return c
}

func matchAll(md, filter map[string]string) bool {
	for k, v := range filter {
		if got, ok := md[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// edf returns q's pending messages in EDF order: ascending priority, ties in enqueue order.
func (q *mq) edf() []*mm {
	var ps []*mm
	for _, x := range q.msgs {
		if x.state == subjects.StatePending {
			ps = append(ps, x)
		}
	}
	slices.SortFunc(ps, byEDF)
	return ps
}

// pick is what a dequeue of batch messages matching filter leases: the EDF-first pending messages,
// skipping values with no room left in an exclusive queue (counting the batch's own picks), and no
// more than max_running leaves room for.
func (q *mq) pick(filter map[string]string, batch int) []*mm {
	return q.pickAs(filter, batch, nil)
}

// pickAs is pick with the messages of as in the state it gives them instead of theirs: the queue
// as it was between two timers that fired at one instant.
func (q *mq) pickAs(filter map[string]string, batch int, as map[*mm]subjects.State) []*mm {
	state := func(x *mm) subjects.State {
		if s, ok := as[x]; ok {
			return s
		}
		return x.state
	}
	room := batch
	running := 0
	held := map[string]int{}
	for _, x := range q.msgs {
		if state(x) == subjects.StateRunning {
			running++
			if q.exclusive() {
				held[x.md[q.cfg.ExclusivityKey]]++
			}
		}
	}
	if q.cfg.MaxRunning > 0 {
		room = min(room, q.cfg.MaxRunning-running)
	}
	if room <= 0 {
		return nil
	}
	var out []*mm
	for _, x := range q.edf() {
		if !matchAll(x.md, filter) || state(x) != subjects.StatePending {
			continue
		}
		if q.exclusive() {
			v := x.md[q.cfg.ExclusivityKey]
			if held[v] >= q.perValue() {
				continue
			}
			held[v]++
		}
		out = append(out, x)
		if len(out) == room {
			break
		}
	}
	return out
}

func (q *mq) leaseFor(req int64, x *mm) int64 {
	switch {
	case req > 0:
		return req
	case x.leaseMS > 0:
		return x.leaseMS
	default:
		return q.cfg.LeaseMS
	}
}

// stamp marks x as the next version written at now, by a transition from prev that publishes an
// event of kind.
func (q *mq) stamp(x *mm, now int64, prev subjects.State, kind subjects.EventKind, reason string) {
	x.version++
	x.updatedAt = now
	if x.state.Terminal() && x.endedAt == 0 {
		x.endedAt = now
	}
	x.events = append(x.events, mev{kind: kind, state: x.state, prev: prev, version: x.version, attempts: x.attempts, reason: reason, at: now, prio: x.prio})
}

// mev is an event as history gives it (the fields the model checks).
type mev struct {
	kind     subjects.EventKind
	state    subjects.State
	prev     subjects.State
	version  uint64
	attempts int
	reason   string
	at       int64 // 0: not checked (a collection's time is known within its slack only)
	prio     int64
}

func visible(x *mm, now, delay int64) {
	if delay > 0 {
		x.state, x.visibleAt = subjects.StateInvisible, now+delay
		return
	}
	x.state, x.visibleAt = subjects.StatePending, now
}

// forgetRequest: a lease used forgets the request id of the dequeue that took it.
func (q *mq) forgetRequest(x *mm) {
	if x.rid == "" {
		return
	}
	r := q.reqs[x.rid]
	if r == nil || r.gaveUp || r.inFlight {
		return
	}
	if slices.Contains(r.leases, lref{x.id, x.leaseID}) {
		delete(q.reqs, x.rid)
	}
}

// fence is the lease check of complete, extend, release and a holder's cancel (protocol.md,
// "Lease holders"; broker's fence).
func (q *mq) fence(x *mm, lease string, op subjects.Op, now int64) (idempotent bool, code subjects.Code) {
	if lease == "" {
		return false, subjects.CodeBadRequest
	}
	if x.leaseID != lease {
		return false, subjects.CodeLeaseMismatch
	}
	switch x.state {
	case subjects.StateRunning:
		if now >= x.leaseExp {
			return false, subjects.CodeLeaseExpired
		}
		q.forgetRequest(x)
		return false, ""
	case subjects.StateCompleted:
		if op == subjects.OpComplete {
			return true, ""
		}
		return false, subjects.CodeInvalidState
	case subjects.StateCanceled:
		return false, subjects.CodeInvalidState
	default:
		if x.released {
			if op == subjects.OpRelease {
				return true, ""
			}
			return false, subjects.CodeInvalidState
		}
		return false, subjects.CodeLeaseExpired
	}
}

// ---- the run ----

func runModel(t *testing.T, seed int64, ops int) {
	e := setup(t)
	m := &model{t: t, e: e, rng: rand.New(rand.NewSource(seed)), seed: seed, stats: map[string]int{}}
	m.restartAt = m.now()
	m.filts = []map[string]string{{"kind": "x"}, {"kind": "y"}, {"proj": "a"}, {"proj": "b"}, {"proj": "a", "kind": "x"}, {"nokey": "z"}}
	m.createQueues()
	for m.step = 1; m.step <= ops; m.step++ {
		if m.step == ops/2 && m.restarts == 0 {
			m.opRestart() // at least one per run
			continue
		}
		m.randomOp()
		if m.step%50 == 0 {
			m.fullCheck("periodic")
		}
	}
	for len(m.waiters) > 0 {
		m.step++
		m.opAdvance()
	}
	m.fullCheck("final")
	for _, q := range m.qs {
		m.stats["enqueue of a stored id past lowered limits"] += q.widened
	}
	t.Logf("seed %d: %d ops, %d restarts; op counts %v", seed, ops, m.restarts, m.stats)
}

func (m *model) createQueues() {
	r := m.rng
	ret := func(choices ...int64) *int64 { return ptr(choices[r.Intn(len(choices))]) }
	q0 := subjects.CreateQueueRequest{LeaseMS: 2000, MaxAttempts: 3, RetentionMS: ret(86_400_000, 86_400_000, 4000)}
	if r.Intn(2) == 0 {
		q0.MaxRunning = 1 + r.Intn(3)
	}
	if r.Intn(3) == 0 {
		q0.InvisibleMS = 700 // the queue's invisibility for enqueues that give none
	}
	q1 := subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "proj", LeaseMS: 3000, MaxAttempts: 2,
		RetentionMS: ret(1500, 86_400_000, 0), MaxRunningPerValue: 1 + r.Intn(2)}
	reqs := map[string]subjects.CreateQueueRequest{"q0": q0, "q1": q1}
	names := []string{"q0", "q1"}
	if r.Intn(2) == 0 {
		reqs["q2"] = subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "proj", LeaseMS: 1000,
			MaxAttempts: 3, RetentionMS: ret(2500, 86_400_000), MaxRunning: 2, MaxRunningPerValue: 1 + r.Intn(3)}
		names = append(names, "q2")
	}
	for _, name := range names {
		req := reqs[name]
		info := m.e.create(name, req)
		cfg := subjects.QueueConfig{Type: subjects.Simple, LeaseMS: req.LeaseMS, InvisibleMS: req.InvisibleMS, MaxAttempts: req.MaxAttempts,
			RetentionMS: *req.RetentionMS, MaxPayloadBytes: 32768, MaxMetadataPairs: 8, MaxRunning: req.MaxRunning}
		if req.Type == subjects.Exclusive {
			cfg.Type, cfg.ExclusivityKey, cfg.MaxRunningPerValue = subjects.Exclusive, req.ExclusivityKey, req.MaxRunningPerValue
		}
		if info.Config != cfg {
			m.failf("create %s: config %+v, want %+v", name, info.Config, cfg)
		}
		m.creates = append(m.creates, req)
		m.qs = append(m.qs, &mq{name: name, cfg: cfg, msgs: map[string]*mm{}, reqs: map[string]*mreq{}, history: map[string][]mev{}})
		m.logf("create %s %s", name, js(req))
	}
}

func (m *model) randomOp() {
	r := m.rng
	q := m.qs[r.Intn(len(m.qs))]
	type op struct {
		w  int
		fn func(*mq)
	}
	table := []op{
		{22, m.opEnqueue},
		{3, m.opEnqueueBatch},
		{20, m.opDequeue},
		{6, m.opExtend},
		{10, m.opComplete},
		{8, m.opRelease},
		{6, m.opCancel},
		{3, m.opRetry},
		{3, m.opReschedule},
		{13, func(*mq) { m.opAdvance() }},
		{2, m.opUpdate},
		{3, m.opGet},
		{4, m.opLongPoll},
		{2, m.opAbandon},
		{3, m.opResettle},
		{2, m.opStats},
		{1, m.opDeleteRecreate},
		{2, m.opDequeueToNobody},
		{2, m.opBrowse},
		{1, func(*mq) { m.opRestart() }},
	}
	total := 0
	for _, o := range table {
		total += o.w
	}
	n := r.Intn(total)
	for _, o := range table {
		if n < o.w {
			o.fn(q)
			break
		}
		n -= o.w
	}
}

func (m *model) checkDepth(q *mq) {
	m.t.Helper()
	var filter map[string]string
	if m.rng.Intn(4) == 0 {
		filter = m.filts[m.rng.Intn(len(m.filts))]
	}
	got := m.e.depth(q.name, filter)
	if want := q.counts(filter); got != want {
		m.failf("depth %s filter %v: got %+v, want %+v", q.name, filter, got, want)
	}
}

// fullCheck gets every id of every queue's pool (and every id the model holds) and checks each
// message and the depths.
func (m *model) fullCheck(why string) {
	m.t.Helper()
	for _, q := range m.qs {
		idset := map[string]bool{}
		for i := range modelIDs {
			idset[fmt.Sprintf("m%02d", i)] = true
		}
		for id := range q.msgs {
			idset[id] = true
		}
		for _, id := range slices.Sorted(maps.Keys(idset)) {
			got, err := call[subjects.Message](m.e, subjects.OpGet, q.name, subjects.GetRequest{ID: id})
			x := q.msgs[id]
			if x == nil {
				m.checkCode(fmt.Sprintf("%s: get %s/%s", why, q.name, id), subjects.CodeMessageNotFound, err)
				continue
			}
			m.checkCode(fmt.Sprintf("%s: get %s/%s", why, q.name, id), "", err)
			if os.Getenv("NATSTONE_MODEL_DEBUG") != "" && why == "after restart" && got.Version != x.version {
				m.dumpLocks(q.name, "before the restart: "+m.locksBefore)
			}
			m.checkMsg(why+": get", q, x, got, true)
		}
		got := m.e.depth(q.name, nil)
		if want := q.counts(nil); got != want {
			m.failf("%s: depth %s: got %+v, want %+v", why, q.name, got, want)
		}
		for _, id := range slices.Sorted(maps.Keys(idset)) {
			m.checkHistory(why, q, id)
		}
	}
}

// checkHistory compares id's history with the events the model expects: those of the message
// of the id, or of the collected one before it.
func (m *model) checkHistory(why string, q *mq, id string) {
	m.t.Helper()
	want := q.history[id]
	if x := q.msgs[id]; x != nil {
		want = x.events
	}
	if want == nil {
		// An id whose message's history the model let go of (see history) may still have events
		// in the stream: nothing to compare.
		return
	}
	got, err := call[subjects.HistoryReply](m.e, subjects.OpHistory, q.name, subjects.HistoryRequest{ID: id})
	what := fmt.Sprintf("%s: history %s/%s", why, q.name, id)
	m.checkCode(what, "", err)
	var g []mev
	failures := 0
	for _, e := range got.Events {
		ev := mev{kind: e.Kind, state: e.State, prev: e.PrevState, version: e.Version, attempts: e.Attempts, reason: e.Reason, at: e.At.UnixMilli(), prio: e.Priority}
		g = append(g, ev)
	}
	for _, e := range want {
		switch {
		case e.kind == subjects.EventExpired || e.kind == subjects.EventErrored:
			failures++
		case e.kind == subjects.EventReleased && e.reason != subjects.ReasonRefunded:
			failures++
		}
	}
	ok := len(g) == len(want)
	for i := 0; ok && i < len(g); i++ {
		w := want[i]
		if w.at == 0 {
			g[i].at = 0 // a collection's time is not checked
		}
		ok = g[i] == w
	}
	if !ok {
		m.failf("%s: events\n  got  %s\n  want %s", what, fmtEvents(g), fmtEvents(want))
	}
	if got.Failures != failures {
		m.failf("%s: failures %d, want %d", what, got.Failures, failures)
	}
	if c := want[len(want)-1].kind == subjects.EventCollected; got.Collected != c {
		m.failf("%s: collected %v, want %v", what, got.Collected, c)
	}
	// The last event of a message still in its queue is current: its time in state runs until now.
	last := got.Events[len(got.Events)-1]
	if live := q.msgs[id] != nil; last.Current != live || live && last.StateMS != m.now()-last.At.UnixMilli() {
		m.failf("%s: last event current %v state_ms %d, want current %v (state_ms %d)", what, last.Current, last.StateMS, live, m.now()-last.At.UnixMilli())
	}
}

func fmtEvents(es []mev) string {
	var s []string
	for _, e := range es {
		at := "?"
		if e.at != 0 {
			at = strconv.FormatInt(e.at-t0.UnixMilli(), 10)
		}
		s = append(s, fmt.Sprintf("v%d %s(%s->%s a%d %s @%s)", e.version, e.kind, e.prev, e.state, e.attempts, e.reason, at))
	}
	return strings.Join(s, ", ")
}

// byEDF orders messages as a queue's pending ones are: by priority, ties in enqueue order.
func byEDF(a, b *mm) int { return cmp.Or(cmp.Compare(a.prio, b.prio), cmp.Compare(a.seq, b.seq)) }

// expire ends x's lease at at, as the broker's timer does: pending again, or errored with no
// attempt left.
func (q *mq) expire(x *mm, at int64) {
	kind, reason := subjects.EventExpired, ""
	if x.attempts >= x.maxAttempts {
		x.state = subjects.StateErrored
		kind, reason = subjects.EventErrored, subjects.ReasonLeaseExpired
	} else {
		visible(x, at, 0)
	}
	x.released = false
	q.stamp(x, at, subjects.StateRunning, kind, reason)
}

// sendMessageOp sends a request whose reply is a message, x as the model has it now (or the error
// want), and checks the queue after it.
func (m *model) sendMessageOp(q *mq, what string, op subjects.Op, req any, want subjects.Code, x *mm) {
	got, err := call[subjects.Message](m.e, op, q.name, req)
	m.logf("%s -> %s %s", what, js(got), js(err))
	m.checkCode(what, want, err)
	if err == nil {
		m.checkMsg(what, q, x, got, false)
	}
	m.after(q)
}

// setIf sets *dst to *v when an update gives v.
func setIf[T any](dst, v *T) {
	if v != nil {
		*dst = *v
	}
}

// ---- id, lease and request choices ----

func (m *model) anyID(q *mq) string {
	return fmt.Sprintf("m%02d", m.rng.Intn(modelIDs))
}

// target picks a message id for a lease operation: mostly a running one.
func (m *model) target(q *mq, prefer subjects.State) string {
	var cands []string
	for _, id := range q.ordered() {
		if q.msgs[id].state == prefer {
			cands = append(cands, id)
		}
	}
	if len(cands) > 0 && m.rng.Intn(10) < 7 {
		return cands[m.rng.Intn(len(cands))]
	}
	ids := q.ordered()
	if len(ids) > 0 && m.rng.Intn(10) < 8 {
		return ids[m.rng.Intn(len(ids))]
	}
	return m.anyID(q)
}

// leaseOf picks a lease id for a call on id: mostly its current one, else a stale one or a bogus
// one; "" only when allowEmpty.
func (m *model) leaseOf(q *mq, id string, allowEmpty bool) string {
	x := q.msgs[id]
	n := m.rng.Intn(100)
	switch {
	case allowEmpty && n < 35:
		return ""
	case x != nil && x.leaseID != "" && n < 80:
		return x.leaseID
	case x != nil && len(x.leases) > 1 && n < 92:
		return x.leases[m.rng.Intn(len(x.leases)-1)] // an older lease
	}
	// A lease of another message, or of an earlier message of this id, or none ever given.
	for _, o := range m.qs {
		for _, yid := range o.ordered() {
			if y := o.msgs[yid]; len(y.leases) > 0 && m.rng.Intn(3) == 0 {
				return y.leases[m.rng.Intn(len(y.leases))]
			}
		}
	}
	return "L-bogus-lease"
}

func (m *model) genMetadata(q *mq) (map[string]string, bool) {
	r := m.rng
	md := map[string]string{}
	vals := []string{"a", "b", "c"}
	if q.exclusive() {
		if r.Intn(40) == 0 {
			// Missing (or empty) exclusivity value: missing_exclusivity_key.
			if r.Intn(2) == 0 {
				md["proj"] = ""
			}
			if r.Intn(2) == 0 {
				md["kind"] = "x"
			}
			if len(md) == 0 {
				return nil, false
			}
			return md, false
		}
		md["proj"] = vals[r.Intn(len(vals))]
	} else if r.Intn(2) == 0 {
		md["proj"] = vals[r.Intn(2)]
	}
	if r.Intn(2) == 0 {
		md["kind"] = []string{"x", "y"}[r.Intn(2)]
	}
	if len(md) == 0 {
		return nil, true
	}
	return md, true
}

// genEnqueue makes a random enqueue request; ok is false when the model expects it refused.
func (m *model) genEnqueue(q *mq) subjects.EnqueueRequest {
	r := m.rng
	now := m.now()
	req := subjects.EnqueueRequest{}
	if r.Intn(20) != 0 {
		req.ID = m.anyID(q)
	}
	switch n := r.Intn(10); {
	case n < 4:
		req.Priority = ptr([]int64{-5, 0, 1, 2, 3, 10}[r.Intn(6)])
	case n < 6:
		req.Priority = ptr(now + int64(r.Intn(7)-3)*100) // near the default: ties and near-ties
	}
	m.payN++
	req.Payload = fmt.Sprintf("pl-%d", m.payN)
	req.Metadata, _ = m.genMetadata(q)
	switch n := r.Intn(20); {
	case n < 4:
		req.InvisibleMS = ptr([]int64{0, 1, 50, 500, 2000, 5000}[r.Intn(6)])
	case n == 4:
		at := time.UnixMilli(now + int64(r.Intn(4000)-1000)).UTC()
		if r.Intn(2) == 0 {
			at = at.Add(time.Duration(1+r.Intn(999_999)) * time.Nanosecond) // rounded up to the next ms
		}
		req.VisibleAt = &at
	case n == 5 && r.Intn(4) == 0:
		req.InvisibleMS = ptr(int64(-1)) // out_of_range
	}
	switch n := r.Intn(20); {
	case n < 5:
		req.MaxAttempts = ptr(int64(1 + r.Intn(3)))
	case n == 5 && r.Intn(3) == 0:
		req.MaxAttempts = ptr([]int64{0, 1001}[r.Intn(2)]) // out_of_range
	}
	if r.Intn(7) == 0 {
		req.LeaseMS = ptr([]int64{0, 300, 1500, 4000}[r.Intn(4)])
	}
	return req
}

// validateEnqueue is the model's check of one message, in the broker's order of checks.
func (q *mq) validateEnqueue(req subjects.EnqueueRequest) subjects.Code {
	code := q.validateWithin(req, q.cfg.MaxPayloadBytes, q.cfg.MaxMetadataPairs)
	if (code == subjects.CodePayloadTooLarge || code == subjects.CodeInvalidMetadata) && req.ID != "" && q.msgs[req.ID] != nil {
		// A stored id is let through the queue's limits, lowered since it was stored: its
		// enqueue is answered duplicate (protocol.md, enqueue's id).
		code = q.validateWithin(req, subjects.MaxPayloadBytes, subjects.MaxMetadataPairs)
		q.widened++
	}
	return code
}

func (q *mq) validateWithin(req subjects.EnqueueRequest, maxPayload, maxPairs int) subjects.Code {
	if len(req.Payload) > maxPayload {
		return subjects.CodePayloadTooLarge
	}
	if len(req.Metadata) > maxPairs {
		return subjects.CodeInvalidMetadata
	}
	if q.exclusive() {
		if v, ok := req.Metadata[q.cfg.ExclusivityKey]; !ok || v == "" {
			return subjects.CodeMissingExclusivityKey
		}
	}
	if req.InvisibleMS != nil && (*req.InvisibleMS < 0 || *req.InvisibleMS > int64(subjects.MaxInvisible/time.Millisecond)) {
		return subjects.CodeOutOfRange
	}
	if req.MaxAttempts != nil && (*req.MaxAttempts < 1 || *req.MaxAttempts > subjects.MaxAttemptsLimit) {
		return subjects.CodeOutOfRange
	}
	return ""
}

// enqueue applies one valid enqueue (id given, or the one the broker generated) and returns its
// reply.
func (q *mq) enqueue(req subjects.EnqueueRequest, id string, now int64) subjects.EnqueueReply {
	if x := q.msgs[id]; x != nil {
		return subjects.EnqueueReply{ID: id, State: x.state, Priority: x.prio, Version: x.version, Duplicate: true, VisibleAt: time.UnixMilli(x.visibleAt).UTC()}
	}
	invisible := q.cfg.InvisibleMS
	switch {
	case req.InvisibleMS != nil:
		invisible = *req.InvisibleMS
	case req.VisibleAt != nil:
		at := req.VisibleAt.UnixMilli()
		if req.VisibleAt.Nanosecond()%int(time.Millisecond) != 0 {
			at++ // "a fraction of one rounded up: not before the time given"
		}
		invisible = max(at-now, 0)
	}
	x := &mm{id: id, state: subjects.StatePending, prio: now + invisible, md: req.Metadata, payload: req.Payload,
		version: 1, maxAttempts: q.cfg.MaxAttempts, enqueuedAt: now, visibleAt: now + invisible, updatedAt: now}
	if len(x.md) == 0 {
		x.md = nil
	}
	if req.Priority != nil {
		x.prio = *req.Priority
	}
	if invisible > 0 {
		x.state = subjects.StateInvisible
	}
	if req.MaxAttempts != nil {
		x.maxAttempts = int(*req.MaxAttempts)
	}
	if req.LeaseMS != nil {
		x.leaseMS = *req.LeaseMS
	}
	q.seq++
	x.seq = q.seq
	x.events = []mev{{kind: subjects.EventEnqueued, state: x.state, version: 1, at: now, prio: x.prio}}
	q.msgs[id] = x
	delete(q.history, id)
	return subjects.EnqueueReply{ID: id, State: x.state, Priority: x.prio, Version: 1, VisibleAt: time.UnixMilli(x.visibleAt).UTC()}
}

func (m *model) checkEnqueueReply(what string, want, got subjects.EnqueueReply) {
	m.t.Helper()
	if want.ID != got.ID || want.State != got.State || want.Priority != got.Priority || want.Version != got.Version ||
		want.Duplicate != got.Duplicate || !want.VisibleAt.Equal(got.VisibleAt) {
		m.failf("%s: reply %s, want %s", what, js(got), js(want))
	}
}

// ---- operations ----

func (m *model) opEnqueue(q *mq) {
	m.stats["enqueue"]++
	req := m.genEnqueue(q)
	now := m.now()
	var got subjects.EnqueueReply
	var err *subjects.Error
	what := fmt.Sprintf("enqueue %s %s", q.name, js(req))
	if m.rng.Intn(5) == 0 {
		// enqueue_raw: the payload as the body, the attributes in headers.
		m.stats["enqueue_raw"]++
		h := map[string]string{}
		if req.ID != "" {
			h["Natstone-Id"] = req.ID
		}
		if req.Priority != nil {
			h["Natstone-Priority"] = strconv.FormatInt(*req.Priority, 10)
		}
		if req.Metadata != nil {
			h["Natstone-Metadata"] = js(req.Metadata)
		}
		if req.InvisibleMS != nil {
			h["Natstone-Invisible-Ms"] = strconv.FormatInt(*req.InvisibleMS, 10)
		}
		if req.LeaseMS != nil {
			h["Natstone-Lease-Ms"] = strconv.FormatInt(*req.LeaseMS, 10)
		}
		if req.MaxAttempts != nil {
			h["Natstone-Max-Attempts"] = strconv.FormatInt(*req.MaxAttempts, 10)
		}
		if req.VisibleAt != nil {
			h["Natstone-Visible-At"] = req.VisibleAt.Format(time.RFC3339Nano)
		}
		msg, rerr := m.e.nc.RequestMsg(natsMsg(m.e.space.Subject(subjects.OpEnqueueRaw, q.name), []byte(req.Payload), h), 10*time.Second)
		if rerr != nil {
			m.t.Fatal(rerr)
		}
		got, err = decodeReply[subjects.EnqueueReply](m.t, msg)
		what = fmt.Sprintf("enqueue_raw %s %v %q", q.name, h, req.Payload)
	} else {
		got, err = call[subjects.EnqueueReply](m.e, subjects.OpEnqueue, q.name, req)
	}
	m.logf("%s -> %s %s", what, js(got), js(err))
	want := q.validateEnqueue(req)
	if want == "" && q.cfg.EnqueueBlocked {
		want = subjects.CodeQueueBlocked
	}
	m.checkCode(what, want, err)
	if err == nil {
		id := req.ID
		if id == "" {
			id = got.ID
			if id == "" || q.msgs[id] != nil {
				m.failf("%s: generated id %q", what, id)
			}
		}
		m.checkEnqueueReply(what, q.enqueue(req, id, now), got)
	}
	m.after(q)
}

func (m *model) opEnqueueBatch(q *mq) {
	m.stats["enqueue_batch"]++
	n := 1 + m.rng.Intn(4)
	var reqs []subjects.EnqueueRequest
	for range n {
		req := m.genEnqueue(q)
		if req.ID == "" {
			req.ID = m.anyID(q)
		}
		reqs = append(reqs, req)
	}
	if n > 1 && m.rng.Intn(3) == 0 {
		reqs[n-1].ID = reqs[0].ID // an id twice in one batch
	}
	now := m.now()
	got, err := call[subjects.EnqueueBatchReply](m.e, subjects.OpEnqueueBatch, q.name, subjects.EnqueueBatchRequest{Messages: reqs})
	m.logf("enqueue_batch %s %s -> %s %s", q.name, js(reqs), js(got), js(err))
	what := fmt.Sprintf("enqueue_batch %s %s", q.name, js(reqs))
	var want subjects.Code
	for _, req := range reqs {
		if want = q.validateEnqueue(req); want != "" {
			break
		}
	}
	if want == "" && q.cfg.EnqueueBlocked {
		want = subjects.CodeQueueBlocked
	}
	m.checkCode(what, want, err)
	if err == nil {
		if len(got.Messages) != len(reqs) {
			m.failf("%s: %d replies", what, len(got.Messages))
		}
		for i, req := range reqs {
			m.checkEnqueueReply(fmt.Sprintf("%s [%d]", what, i), q.enqueue(req, req.ID, now), got.Messages[i])
		}
	}
	m.after(q)
}

func (m *model) genDequeue(q *mq) subjects.DequeueRequest {
	r := m.rng
	req := subjects.DequeueRequest{Batch: []int{0, 1, 1, 2, 3, 4}[r.Intn(6)]}
	if r.Intn(60) == 0 {
		req.Batch = 257 // out_of_range
	}
	if r.Intn(10) < 3 {
		req.Filter = m.filts[r.Intn(len(m.filts))]
	}
	switch n := r.Intn(30); {
	case n < 6:
		req.LeaseMS = []int64{500, 1000, 5000}[r.Intn(3)]
	case n == 6 && r.Intn(3) == 0:
		req.LeaseMS = 50 // out_of_range
	}
	switch n := r.Intn(20); {
	case n < 6:
		m.ridN++
		req.RequestID = fmt.Sprintf("r%d", m.ridN)
	case n < 9 && len(q.rids) > 0:
		req.RequestID = q.rids[r.Intn(len(q.rids))] // a retry, or a reuse
	}
	return req
}

// expectDequeue is what a dequeue leases (fresh) or gives back (replayed), or its error.
func (m *model) expectDequeue(q *mq, req subjects.DequeueRequest, now int64) (fresh []*mm, replay []lref, code subjects.Code) {
	batch := req.Batch
	if batch == 0 {
		batch = 1
	}
	switch {
	case batch < 1 || batch > subjects.MaxDequeueBatch:
		return nil, nil, subjects.CodeOutOfRange
	case req.LeaseMS != 0 && (req.LeaseMS < 100 || req.LeaseMS > int64(subjects.MaxLease/time.Millisecond)):
		return nil, nil, subjects.CodeOutOfRange
	}
	if req.RequestID != "" {
		if p := q.reqs[req.RequestID]; p != nil && p.until >= now {
			if p.gaveUp {
				return nil, []lref{}, "" // abandoned: answers empty
			}
			held := []lref{}
			for _, l := range p.leases {
				if x := q.msgs[l.id]; x != nil && x.state == subjects.StateRunning && x.leaseID == l.lease {
					held = append(held, l)
				}
			}
			return nil, held, ""
		}
	}
	if q.cfg.DequeueBlocked {
		return nil, nil, subjects.CodeQueueBlocked
	}
	return q.pick(req.Filter, batch), nil, ""
}

// applyLeases applies the leases of a dequeue as the broker's reply gave them (after the reply's
// ids were checked against fresh).
func (m *model) applyLeases(what string, q *mq, req subjects.DequeueRequest, fresh []*mm, got []subjects.Message, now int64) {
	m.t.Helper()
	if !slices.Equal(ids(got), mmIDs(fresh)) {
		m.failf("%s: leased %v, want %v (pending in EDF order: %s; running: %s)", what, ids(got), mmIDs(fresh), q.describePending(), q.describeRunning())
	}
	var leases []lref
	for i, x := range fresh {
		g := got[i]
		if g.LeaseID == "" || slices.Contains(x.leases, g.LeaseID) {
			m.failf("%s: %s leased with lease id %q (its earlier: %v)", what, x.id, g.LeaseID, x.leases)
		}
		x.state = subjects.StateRunning
		x.attempts++
		x.leaseID = g.LeaseID
		x.leases = append(x.leases, g.LeaseID)
		x.leaseExp = now + q.leaseFor(req.LeaseMS, x)
		x.rid = req.RequestID
		x.released = false
		q.stamp(x, now, subjects.StatePending, subjects.EventLeased, "")
		m.checkMsg(what, q, x, g, true)
		leases = append(leases, lref{x.id, x.leaseID})
	}
	if req.RequestID != "" {
		if len(leases) > 0 {
			q.reqs[req.RequestID] = &mreq{leases: leases, until: now + ridWindowMS}
			q.addRid(req.RequestID)
		} else {
			delete(q.reqs, req.RequestID)
		}
	}
}

func mmIDs(xs []*mm) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.id
	}
	return out
}

func (q *mq) describePending() string {
	var s []string
	for _, x := range q.edf() {
		p := strconv.FormatInt(x.prio, 10)
		if x.prio > 1e12 {
			p = "t+" + strconv.FormatInt(x.prio-t0.UnixMilli(), 10)
		}
		s = append(s, fmt.Sprintf("%s(p=%s,seq=%d,md=%v)", x.id, p, x.seq, x.md))
	}
	return strings.Join(s, " ")
}

func (q *mq) describeRunning() string {
	var s []string
	for _, id := range q.ordered() {
		if x := q.msgs[id]; x.state == subjects.StateRunning {
			s = append(s, fmt.Sprintf("%s(md=%v)", x.id, x.md))
		}
	}
	return fmt.Sprintf("%s [max_running %d, per value %d]", strings.Join(s, " "), q.cfg.MaxRunning, q.cfg.MaxRunningPerValue)
}

func (m *model) opDequeue(q *mq) {
	m.stats["dequeue"]++
	req := m.genDequeue(q)
	now := m.now()
	fresh, replay, want := m.expectDequeue(q, req, now)
	got, err := call[subjects.DequeueReply](m.e, subjects.OpDequeue, q.name, req)
	m.logf("dequeue %s %s -> %v %s", q.name, js(req), leaseList(got.Messages), js(err))
	what := fmt.Sprintf("dequeue %s %s", q.name, js(req))
	m.checkCode(what, want, err)
	switch {
	case err != nil:
	case replay != nil:
		m.checkReplay(what, q, replay, got.Messages)
	default:
		m.applyLeases(what, q, req, fresh, got.Messages, now)
	}
	m.after(q)
}

func leaseList(ms []subjects.Message) []string {
	out := make([]string, len(ms))
	for i, x := range ms {
		out[i] = x.ID + ":" + x.LeaseID
	}
	return out
}

// settleNext is a settle's next (sometimes), and what it leases.
func (m *model) genNext(q *mq) *subjects.DequeueRequest {
	if m.rng.Intn(5) != 0 {
		return nil
	}
	n := &subjects.DequeueRequest{Batch: 1 + m.rng.Intn(3)}
	if m.rng.Intn(4) == 0 {
		n.Filter = m.filts[m.rng.Intn(len(m.filts))]
	}
	switch k := m.rng.Intn(10); {
	case k < 4:
		m.ridN++
		n.RequestID = fmt.Sprintf("r%d", m.ridN)
	case k < 5 && len(q.rids) > 0:
		n.RequestID = q.rids[m.rng.Intn(len(q.rids))]
	}
	return n
}

// lastSettle is the last settle with a next, for a retry of the same request.
type lastSettle struct {
	q     *mq
	op    subjects.Op
	body  any
	id    string
	next  *subjects.DequeueRequest
	apply func(now int64) (*mm, subjects.Code)
}

// opResettle sends the last settle with a next again, as a client whose reply was lost would.
func (m *model) opResettle(q *mq) {
	l := m.lastSettle
	if l == nil {
		m.opComplete(q)
		return
	}
	m.stats["settle sent again"]++
	m.settle(l.q, l.op, l.body, l.id, l.next, l.apply)
}

// settle runs a complete, release or cancel (with next, if given) against the broker and checks it
// against the model: apply returns the expected error code and applies the settle to the model.
func (m *model) settle(q *mq, op subjects.Op, body any, id string, next *subjects.DequeueRequest, apply func(now int64) (x *mm, code subjects.Code)) {
	m.t.Helper()
	now := m.now()
	what := fmt.Sprintf("%s %s %s", op, q.name, js(body))
	x, want := apply(now)
	if next == nil {
		m.sendMessageOp(q, what, op, body, want, x)
		return
	}
	m.lastSettle = &lastSettle{q: q, op: op, body: body, id: id, next: next, apply: apply}
	lease := leaseOfBody(body)
	rid := next.RequestID
	var replayed *mreq // the remembered dequeue whose settle this is, sent again
	if want != "" && rid != "" {
		if p := q.reqs[rid]; p != nil && p.until >= now && p.settled != nil && p.settled.op == op && p.settled.id == id && p.settled.lease == lease {
			replayed, want = p, ""
		}
	}
	got, err := call[subjects.SettleReply](m.e, op, q.name, body)
	m.logf("%s -> %s next %v %s", what, js(got.Message), leaseList(nextMsgs(got.Next)), js(err))
	m.checkCode(what, want, err)
	if err != nil {
		m.after(q)
		return
	}
	m.stats["settle with next"]++
	if got.Next == nil {
		m.failf("%s: reply without next", what)
	}
	if replayed != nil {
		// The settle failed now, but its first reply is given back (protocol.md, "Settle and take
		// the next message").
		m.stats["settle replayed"]++
		sv := replayed.settled
		w := q.view(sv.x)
		w.State, w.LeaseID, w.Version, w.Attempts = sv.reply.State, sv.reply.LeaseID, sv.reply.Version, sv.reply.Attempts
		w.AttemptsLeft = max(sv.x.maxAttempts-sv.reply.Attempts, 0)
		w.LeaseExpiresAt = nil
		w.VisibleAt, w.UpdatedAt, w.EndedAt = sv.reply.VisibleAt, sv.reply.UpdatedAt, sv.reply.EndedAt
		if d := diffMsg(w, got.Message, "", false); d != "" {
			m.failf("%s: the settle's reply given back differs: %s", what, d)
		}
		m.checkReplay(what+" next", q, m.held(q, replayed), got.Next.Messages)
		m.after(q)
		return
	}
	m.checkMsg(what, q, x, got.Message, false)
	m.serveWaiters() // the settle's write serves parked polls before its next dequeues
	fresh, replay, wantNext := m.expectDequeue(q, *next, now)
	if codeOf(got.Next.Error) != wantNext {
		m.failf("%s: next error %s, want %q", what, js(got.Next.Error), wantNext)
	}
	switch {
	case wantNext != "":
	case replay != nil:
		m.checkReplay(what+" next", q, replay, got.Next.Messages)
	default:
		m.applyLeases(what+" next", q, *next, fresh, got.Next.Messages, now)
		if rid != "" {
			rec := q.reqs[rid]
			if rec == nil {
				// It leased nothing: kept for the settle's retry until a minute after the
				// settled lease would have run out (keepSettled), within the 5 minutes.
				rec = &mreq{until: now + ridWindowMS}
				if x.leaseID == lease && x.leaseExp > 0 {
					rec.until = min(rec.until, x.leaseExp+60_000)
				}
				q.reqs[rid] = rec
			}
			rec.settled = &msettled{op: op, id: id, lease: lease, reply: got.Message, x: x}
		}
	}
	m.after(q)
}

func leaseOfBody(body any) string {
	switch b := body.(type) {
	case subjects.LeaseRequest:
		return b.LeaseID
	case subjects.ReleaseRequest:
		return b.LeaseID
	}
	panic(fmt.Sprintf("no lease in %T", body))
}

// held is what of a remembered dequeue's leases is still held.
func (m *model) held(q *mq, p *mreq) []lref {
	held := []lref{}
	for _, l := range p.leases {
		if x := q.msgs[l.id]; x != nil && x.state == subjects.StateRunning && x.leaseID == l.lease {
			held = append(held, l)
		}
	}
	return held
}

func (m *model) checkReplay(what string, q *mq, replay []lref, got []subjects.Message) {
	m.t.Helper()
	m.stats["dequeue replayed"]++
	if len(got) != len(replay) {
		m.failf("%s: a retry with a remembered request id got %v, want the leases still held %v", what, leaseList(got), replay)
	}
	for i, l := range replay {
		if got[i].ID != l.id || got[i].LeaseID != l.lease {
			m.failf("%s: a retry with a remembered request id got %v, want the leases still held %v", what, leaseList(got), replay)
		}
		m.checkMsg(what, q, q.msgs[l.id], got[i], true)
	}
}

func nextMsgs(n *subjects.NextReply) []subjects.Message {
	if n == nil {
		return nil
	}
	return n.Messages
}

func (m *model) opComplete(q *mq) {
	m.stats["complete"]++
	id := m.target(q, subjects.StateRunning)
	req := subjects.LeaseRequest{ID: id, LeaseID: m.leaseOf(q, id, false), Next: m.genNext(q)}
	m.settle(q, subjects.OpComplete, req, id, req.Next, func(now int64) (*mm, subjects.Code) {
		x := q.msgs[id]
		if x == nil {
			return nil, subjects.CodeMessageNotFound
		}
		done, code := q.fence(x, req.LeaseID, subjects.OpComplete, now)
		if code != "" || done {
			return x, code
		}
		x.state = subjects.StateCompleted
		x.rid = ""
		q.stamp(x, now, subjects.StateRunning, subjects.EventCompleted, "")
		return x, ""
	})
}

func (m *model) opExtend(q *mq) {
	m.stats["extend"]++
	id := m.target(q, subjects.StateRunning)
	req := subjects.ExtendRequest{ID: id, LeaseID: m.leaseOf(q, id, false)}
	switch n := m.rng.Intn(10); {
	case n < 4:
		req.LeaseMS = []int64{300, 2500, 8000}[m.rng.Intn(3)]
	case n == 4 && m.rng.Intn(4) == 0:
		req.LeaseMS = 99 // out_of_range
	}
	now := m.now()
	what := fmt.Sprintf("extend %s %s", q.name, js(req))
	x := q.msgs[id]
	var want subjects.Code
	switch {
	case req.LeaseMS != 0 && (req.LeaseMS < 100 || req.LeaseMS > int64(subjects.MaxLease/time.Millisecond)):
		want = subjects.CodeOutOfRange
	case x == nil:
		want = subjects.CodeMessageNotFound
	default:
		if _, want = q.fence(x, req.LeaseID, subjects.OpExtend, now); want == "" {
			x.leaseExp = now + q.leaseFor(req.LeaseMS, x)
			x.rid = ""
			q.stamp(x, now, subjects.StateRunning, subjects.EventExtended, "")
		}
	}
	m.sendMessageOp(q, what, subjects.OpExtend, req, want, x)
}

func (m *model) opRelease(q *mq) {
	m.stats["release"]++
	id := m.target(q, subjects.StateRunning)
	req := subjects.ReleaseRequest{ID: id, LeaseID: m.leaseOf(q, id, false), Next: m.genNext(q)}
	switch n := m.rng.Intn(10); {
	case n < 4:
		req.DelayMS = []int64{1, 200, 1000, 3000}[m.rng.Intn(4)]
	case n == 4 && m.rng.Intn(4) == 0:
		req.DelayMS = -1 // out_of_range
	}
	if m.rng.Intn(5) == 0 {
		req.Refund = true
	}
	if m.rng.Intn(3) == 0 {
		req.Error = "handler failed"
	}
	m.settle(q, subjects.OpRelease, req, id, req.Next, func(now int64) (*mm, subjects.Code) {
		if req.DelayMS < 0 || req.DelayMS > int64(subjects.MaxInvisible/time.Millisecond) {
			return nil, subjects.CodeOutOfRange
		}
		x := q.msgs[id]
		if x == nil {
			return nil, subjects.CodeMessageNotFound
		}
		done, code := q.fence(x, req.LeaseID, subjects.OpRelease, now)
		if code != "" || done {
			return x, code
		}
		x.released = true
		x.rid = ""
		if req.Refund && x.attempts > 0 {
			x.attempts--
		}
		kind, reason := subjects.EventReleased, ""
		if req.Refund {
			reason = subjects.ReasonRefunded
		}
		if x.attempts >= x.maxAttempts {
			x.state = subjects.StateErrored
			kind, reason = subjects.EventErrored, subjects.ReasonReleased
		} else {
			visible(x, now, req.DelayMS)
		}
		q.stamp(x, now, subjects.StateRunning, kind, reason)
		return x, ""
	})
}

func (m *model) opCancel(q *mq) {
	m.stats["cancel"]++
	prefer := subjects.StateRunning
	if m.rng.Intn(3) == 0 {
		prefer = []subjects.State{subjects.StatePending, subjects.StateInvisible, subjects.StateCanceled, subjects.StateErrored}[m.rng.Intn(4)]
	}
	id := m.target(q, prefer)
	req := subjects.LeaseRequest{ID: id, LeaseID: m.leaseOf(q, id, true), Next: m.genNext(q)}
	if x := q.msgs[id]; x != nil && m.rng.Intn(6) == 0 {
		req.Version = x.version - uint64(m.rng.Intn(2)) // its version, or a stale one
	}
	if m.rng.Intn(4) == 0 {
		req.Error = "operator said so"
	}
	m.settle(q, subjects.OpCancel, req, id, req.Next, func(now int64) (*mm, subjects.Code) {
		x := q.msgs[id]
		if x == nil {
			return nil, subjects.CodeMessageNotFound
		}
		switch x.state {
		case subjects.StateCanceled:
			if req.LeaseID != "" && req.LeaseID != x.leaseID {
				return x, subjects.CodeLeaseMismatch
			}
			return x, ""
		case subjects.StateCompleted, subjects.StateErrored:
			if req.LeaseID != "" {
				if _, code := q.fence(x, req.LeaseID, subjects.OpCancel, now); code != "" {
					return x, code
				}
			}
			return x, subjects.CodeInvalidState
		}
		if req.Version != 0 && req.Version != x.version {
			return x, subjects.CodeRevisionMismatch
		}
		if req.LeaseID != "" {
			if _, code := q.fence(x, req.LeaseID, subjects.OpCancel, now); code != "" {
				return x, code
			}
			x.rid = ""
		}
		prev := x.state
		x.state = subjects.StateCanceled
		q.stamp(x, now, prev, subjects.EventCanceled, "")
		return x, ""
	})
}

func (m *model) opRetry(q *mq) {
	m.stats["retry"]++
	prefer := []subjects.State{subjects.StateErrored, subjects.StateCanceled, subjects.StateCompleted}[m.rng.Intn(3)]
	id := m.target(q, prefer)
	req := subjects.RetryRequest{ID: id}
	if m.rng.Intn(3) == 0 {
		req.DelayMS = []int64{100, 2000}[m.rng.Intn(2)]
	}
	x := q.msgs[id]
	if x != nil && m.rng.Intn(4) == 0 {
		req.Version = x.version - uint64(m.rng.Intn(2))
	}
	now := m.now()
	what := fmt.Sprintf("retry %s %s", q.name, js(req))
	var want subjects.Code
	switch {
	case x == nil:
		want = subjects.CodeMessageNotFound
	case !x.state.Terminal():
	case x.state == subjects.StateCompleted:
		want = subjects.CodeInvalidState
	case req.Version != 0 && req.Version != x.version:
		want = subjects.CodeRevisionMismatch
	default:
		prev := x.state
		visible(x, now, req.DelayMS)
		x.attempts = 0
		x.leaseID, x.leaseExp, x.rid, x.released = "", 0, "", false
		x.endedAt = 0
		q.stamp(x, now, prev, subjects.EventRetried, "")
	}
	m.sendMessageOp(q, what, subjects.OpRetry, req, want, x)
}

func (m *model) opReschedule(q *mq) {
	m.stats["reschedule"]++
	prefer := []subjects.State{subjects.StatePending, subjects.StateInvisible}[m.rng.Intn(2)]
	id := m.target(q, prefer)
	req := subjects.RescheduleRequest{ID: id}
	switch m.rng.Intn(3) {
	case 0:
		req.Priority = ptr([]int64{-7, 1, 4}[m.rng.Intn(3)])
	case 1:
		req.DelayMS = ptr([]int64{0, 0, 300, 1500}[m.rng.Intn(4)])
	default:
		req.Priority = ptr([]int64{-7, 1, 4}[m.rng.Intn(3)])
		req.DelayMS = ptr([]int64{0, 300}[m.rng.Intn(2)])
	}
	x := q.msgs[id]
	if x != nil && m.rng.Intn(5) == 0 {
		req.Version = x.version - uint64(m.rng.Intn(2))
	}
	now := m.now()
	what := fmt.Sprintf("reschedule %s %s", q.name, js(req))
	var want subjects.Code
	if x == nil {
		want = subjects.CodeMessageNotFound
	} else {
		at := now
		if req.DelayMS != nil {
			at = now + *req.DelayMS
		}
		moves := req.DelayMS != nil
		asAsked := at <= now && x.state == subjects.StatePending
		switch {
		case x.state != subjects.StatePending && x.state != subjects.StateInvisible:
			want = subjects.CodeInvalidState
		case (req.Priority == nil || *req.Priority == x.prio) && (!moves || asAsked):
		case req.Version != 0 && req.Version != x.version:
			want = subjects.CodeRevisionMismatch
		default:
			prev := x.state
			readiness := x.prio == x.visibleAt
			if req.Priority != nil {
				x.prio = *req.Priority
			}
			if moves && !asAsked {
				visible(x, now, at-now)
				if req.Priority == nil && readiness {
					x.prio = x.visibleAt
				}
			}
			q.stamp(x, now, prev, subjects.EventRescheduled, "")
		}
	}
	m.sendMessageOp(q, what, subjects.OpReschedule, req, want, x)
}

func (m *model) opGet(q *mq) {
	m.stats["get"]++
	id := m.target(q, subjects.StateRunning)
	got, err := call[subjects.Message](m.e, subjects.OpGet, q.name, subjects.GetRequest{ID: id})
	m.logf("get %s %s -> %s %s", q.name, id, js(got), js(err))
	x := q.msgs[id]
	if x == nil {
		m.checkCode("get "+q.name+"/"+id, subjects.CodeMessageNotFound, err)
		return
	}
	m.checkCode("get "+q.name+"/"+id, "", err)
	m.checkMsg("get", q, x, got, true)
}

func (m *model) opUpdate(q *mq) {
	m.stats["update"]++
	r := m.rng
	req := subjects.UpdateQueueRequest{}
	switch {
	case q.cfg.EnqueueBlocked && r.Intn(2) == 0:
		req.EnqueueBlocked = ptr(false)
	case q.cfg.DequeueBlocked && r.Intn(2) == 0:
		req.DequeueBlocked = ptr(false)
	default:
		switch r.Intn(8) {
		case 6:
			// Lowered below what stored messages have: new ones are refused, their ids' retries
			// still duplicate.
			req.MaxMetadataPairs = ptr([]int{1, 8}[r.Intn(2)])
		case 7:
			req.MaxPayloadBytes = ptr([]int{5, 32768}[r.Intn(2)])
		case 0:
			req.EnqueueBlocked = ptr(!q.cfg.EnqueueBlocked)
		case 1:
			req.DequeueBlocked = ptr(!q.cfg.DequeueBlocked)
		case 2:
			req.MaxRunning = ptr(r.Intn(4))
		case 3:
			if q.exclusive() {
				req.MaxRunningPerValue = ptr(1 + r.Intn(3))
			} else {
				req.MaxRunning = ptr(r.Intn(4))
			}
		case 4:
			req.LeaseMS = ptr([]int64{1000, 2000, 5000}[r.Intn(3)])
		case 5:
			req.MaxAttempts = ptr(1 + r.Intn(4))
		}
	}
	cfg := q.cfg
	setIf(&cfg.EnqueueBlocked, req.EnqueueBlocked)
	setIf(&cfg.DequeueBlocked, req.DequeueBlocked)
	setIf(&cfg.MaxRunning, req.MaxRunning)
	setIf(&cfg.MaxRunningPerValue, req.MaxRunningPerValue)
	setIf(&cfg.LeaseMS, req.LeaseMS)
	setIf(&cfg.MaxAttempts, req.MaxAttempts)
	setIf(&cfg.MaxMetadataPairs, req.MaxMetadataPairs)
	setIf(&cfg.MaxPayloadBytes, req.MaxPayloadBytes)
	q.cfg = cfg
	got, err := call[subjects.QueueInfo](m.e, subjects.OpUpdate, q.name, req)
	m.logf("update %s %s -> %s %s", q.name, js(req), js(got.Config), js(err))
	what := fmt.Sprintf("update %s %s", q.name, js(req))
	m.checkCode(what, "", err)
	if got.Config != cfg {
		m.failf("%s: config %+v, want %+v", what, got.Config, cfg)
	}
	if want := q.counts(nil); got.Counts != want {
		m.failf("%s: counts %+v, want %+v", what, got.Counts, want)
	}
	m.after(q)
}

// opAdvance moves the fake clock: invisibility windows and leases that end meanwhile end in the
// model at their own times; collections are checked with the documented slack.
func (m *model) opAdvance() {
	m.stats["advance"]++
	r := m.rng
	var d int64
	switch n := r.Intn(100); {
	case n < 40:
		d = int64(1 + r.Intn(200))
	case n < 80:
		d = int64(200 + r.Intn(2800))
	case n < 96:
		d = int64(3000 + r.Intn(7000))
	default:
		d = int64(30_000 + r.Intn(370_000))
	}
	target := m.now() + d
	m.ties = nil
	if len(m.waiters) > 0 {
		// Stop at the first event (an invisibility's or a lease's end) of a queue with a parked
		// poll, or a poll's deadline: the poll then leases at that instant, as the model does.
		for _, w := range m.waiters {
			target = min(target, w.deadline)
			for _, x := range w.q.msgs {
				switch x.state {
				case subjects.StateInvisible:
					target = min(target, x.visibleAt)
				case subjects.StateRunning:
					target = min(target, x.leaseExp)
				}
			}
		}
		d = target - m.now()
	}
	for _, q := range m.qs {
		for _, x := range q.msgs {
			switch {
			case x.state == subjects.StateInvisible && x.visibleAt <= target:
				x.state = subjects.StatePending
				q.stamp(x, x.visibleAt, subjects.StateInvisible, subjects.EventPending, "")
			case x.state == subjects.StateRunning && x.leaseExp <= target:
				q.expire(x, x.leaseExp)
			}
		}
	}
	if len(m.waiters) > 0 {
		m.ties = map[*mq][]map[*mm]subjects.State{}
		for _, q := range m.qs {
			ended, expired := map[*mm]subjects.State{}, map[*mm]subjects.State{}
			for _, x := range q.msgs {
				if x.updatedAt != target || len(x.events) == 0 || x.events[len(x.events)-1].at != target {
					continue
				}
				switch x.events[len(x.events)-1].kind {
				case subjects.EventPending:
					ended[x] = subjects.StateInvisible // as if its timer had not fired yet
				case subjects.EventExpired, subjects.EventErrored:
					expired[x] = subjects.StateRunning
				}
			}
			if len(ended) > 0 && len(expired) > 0 {
				m.ties[q] = []map[*mm]subjects.State{ended, expired}
			}
		}
	}
	m.e.advance(time.Duration(d) * time.Millisecond)
	m.advanced = true
	m.logf("advance %d ms", d)
	m.serveWaiters()
	m.ties = nil
	m.resolveCollections()
	for _, q := range m.qs {
		got := m.e.depth(q.name, nil)
		if want := q.counts(nil); got != want {
			m.failf("after advance %d ms: depth %s: got %+v, want %+v", d, q.name, got, want)
		}
	}
}

// resolveCollections looks at each finished message whose retention has ended: collected once its
// retention ended more than gcSlackMS ago (protocol.md: collections are batched, at least 100 ms
// apart, "so up to about 100 ms later"), either until then.
func (m *model) resolveCollections() {
	now := m.now()
	for _, q := range m.qs {
		for _, id := range q.ordered() {
			x := q.msgs[id]
			if !x.state.Terminal() {
				continue
			}
			due := x.endedAt + q.cfg.RetentionMS
			if due > now {
				continue
			}
			must := now > due+gcSlackMS && (m.advanced || due > m.restartAt)
			got, err := call[subjects.Message](m.e, subjects.OpGet, q.name, subjects.GetRequest{ID: id})
			switch {
			case codeOf(err) == subjects.CodeMessageNotFound:
				m.logf("collected %s/%s (due t+%d)", q.name, id, due-t0.UnixMilli())
				m.stats["collected"]++
				q.history[id] = append(x.events, mev{kind: subjects.EventCollected, prev: x.state, version: x.version + 1, attempts: x.attempts, prio: x.prio})
				delete(q.msgs, id)
			case err != nil:
				m.failf("get %s/%s: %v", q.name, id, err)
			case must:
				m.failf("%s/%s %s since t+%d, its retention (%d ms) ended at t+%d, still not collected at t+%d", q.name, id, x.state, x.endedAt-t0.UnixMilli(), q.cfg.RetentionMS, due-t0.UnixMilli(), now-t0.UnixMilli())
			default:
				m.checkMsg("get (collection due)", q, x, got, true)
			}
		}
	}
}

// opRestart restarts the broker (alone, with its NATS server, or the server uncleanly) and
// rebuilds what the model says the broker keeps in memory only from the records, as recovery does.
func (m *model) opRestart() {
	m.restarts++
	if os.Getenv("NATSTONE_MODEL_DEBUG") != "" {
		m.locksBefore = m.locksNow()
	}
	how := m.rng.Intn(10)
	if len(m.waiters) > 0 {
		how = 0 // the polls parked get unavailable from the stop (restartAll would drop the connection they wait on)
	}
	stopping := m.waiters
	m.waiters = nil
	var downtime int64
	switch {
	case how < 3:
		// Stopped while time passes: leases and invisibilities end, retentions run out, with no
		// broker; the next one moves them at its start (its timers due at once).
		downtime = []int64{500, 3000, 20_000, 400_000}[m.rng.Intn(4)]
		m.stats["restart broker after a downtime"]++
		m.logf("stop broker, %d ms pass, start broker", downtime)
		m.e.stopBroker(m.e.b)
		m.e.advance(time.Duration(downtime) * time.Millisecond)
		m.e.startBroker()
	case how < 6:
		m.stats["restart broker"]++
		m.logf("restart broker")
		m.e.restartBroker()
	case how < 8:
		m.stats["restart all"]++
		m.logf("restart broker and NATS")
		m.e.restartAll()
	default:
		m.stats["restart all unclean"]++
		m.logf("restart broker and NATS, unclean")
		m.e.restartAllUnclean()
	}
	for _, w := range stopping {
		got, err := w.reply(m)
		m.logf("%s -> (at the stop) %v %s", w.what, leaseList(got.Messages), js(err))
		m.checkCode(w.what+" parked when the broker stopped", subjects.CodeUnavailable, err)
	}
	m.restartAt, m.advanced = m.now(), false
	now := m.now()
	for _, q := range m.qs {
		q.rebuildRequests(now)
	}
	if downtime > 0 {
		// What came due while no broker ran moves at the start's time, at the first timers'
		// firing (an advance of 0 on the fake clock).
		for _, q := range m.qs {
			for _, id := range q.ordered() {
				switch x := q.msgs[id]; {
				case x.state == subjects.StateInvisible && x.visibleAt <= now:
					x.state = subjects.StatePending
					q.stamp(x, now, subjects.StateInvisible, subjects.EventPending, "")
				case x.state == subjects.StateRunning && x.leaseExp <= now:
					q.expire(x, now)
				default:
					continue
				}
			}
		}
		m.e.advance(0)
		m.advanced = true
		m.resolveCollections()
	}
	m.fullCheck("after restart")
}

// rebuildRequests is recovery's rebuild of the remembered request ids from the records
// (protocol.md, dequeue's request_id: "across a broker restart (which finds the ids in the stored
// messages, remembered for 5 minutes from the dequeue, or from the last write of its messages once
// none runs)").
func (q *mq) rebuildRequests(now int64) {
	q.reqs = map[string]*mreq{}
	cut := now - ridWindowMS
	leased := map[string]int64{}
	last := map[string]int64{}
	var running = map[string][]*mm{}
	for _, x := range q.msgs {
		if x.rid == "" || x.updatedAt < cut {
			continue
		}
		last[x.rid] = max(last[x.rid], x.updatedAt)
		if x.state == subjects.StateRunning {
			running[x.rid] = append(running[x.rid], x)
			leased[x.rid] = max(leased[x.rid], x.updatedAt)
		}
	}
	for rid, at := range last {
		r := &mreq{}
		if t, ok := leased[rid]; ok {
			at = t
			xs := slices.DeleteFunc(running[rid], func(x *mm) bool { return x.updatedAt != t })
			slices.SortFunc(xs, byEDF)
			for _, x := range xs {
				r.leases = append(r.leases, lref{x.id, x.leaseID})
			}
		}
		r.until = at + ridWindowMS
		q.reqs[rid] = r
	}
}

// ---- long polls ----

// mwaiter is a dequeue with wait_ms parked at the broker.
type mwaiter struct {
	q        *mq
	req      subjects.DequeueRequest
	deadline int64
	sentAt   int64
	sub      *nats.Subscription
	what     string
}

func (w *mwaiter) reply(m *model) (subjects.DequeueReply, *subjects.Error) {
	m.t.Helper()
	msg, err := w.sub.NextMsg(15 * time.Second)
	if err != nil {
		m.failf("%s: no reply within 15 s (%v)", w.what, err)
	}
	_ = w.sub.Unsubscribe()
	return decodeReply[subjects.DequeueReply](m.t, msg)
}

// after serves the parked polls an operation on q made room for, then checks q's depth.
func (m *model) after(q *mq) {
	m.t.Helper()
	m.serveWaiters()
	m.checkDepth(q)
}

// serveWaiters: the broker hands what became eligible to the parked polls in the order they came
// (design.md, "Long polls and request ids"); a poll whose wait ended gets an empty reply.
func (m *model) serveWaiters() {
	m.t.Helper()
	now := m.now()
	kept := m.waiters[:0]
	for _, w := range m.waiters {
		q := w.q
		var fresh []*mm
		var alts [][]*mm // what it may take instead, served between two timers of this instant
		if !q.cfg.DequeueBlocked {
			fresh = q.pick(w.req.Filter, max(w.req.Batch, 1))
			for _, as := range m.ties[q] {
				alts = append(alts, q.pickAs(w.req.Filter, max(w.req.Batch, 1), as))
			}
		}
		if len(fresh) == 0 && w.deadline > now {
			kept = append(kept, w)
			continue
		}
		got, err := w.reply(m)
		m.logf("%s -> (served at t+%d) %v %s", w.what, now-t0.UnixMilli(), leaseList(got.Messages), js(err))
		m.checkCode(w.what, "", err)
		if len(got.Messages) == 0 && w.deadline <= now {
			// Its wait ended: empty, unless served at that very instant (then either). A request
			// id that leased nothing is not remembered.
			if w.req.RequestID != "" {
				delete(q.reqs, w.req.RequestID)
				q.addRid(w.req.RequestID)
			}
			continue
		}
		m.stats["long poll served"]++
		if !slices.Equal(ids(got.Messages), mmIDs(fresh)) {
			for _, alt := range alts {
				if len(alt) > 0 && slices.Equal(ids(got.Messages), mmIDs(alt)) {
					m.stats["long poll served between timers"]++
					fresh = alt
					break
				}
			}
		}
		if w.req.RequestID != "" {
			delete(q.reqs, w.req.RequestID) // applyLeases remembers it anew, from its arrival
		}
		m.applyLeases(w.what+" (served while parked)", q, w.req, fresh, got.Messages, now)
		if rec := q.reqs[w.req.RequestID]; w.req.RequestID != "" && rec != nil {
			rec.until = w.sentAt + ridWindowMS
		}
	}
	clear(m.waiters[len(kept):])
	m.waiters = kept
}

// opLongPoll sends a dequeue with wait_ms; one that finds nothing eligible parks, and later
// operations serve it.
func (m *model) opLongPoll(q *mq) {
	m.stats["long poll"]++
	r := m.rng
	req := subjects.DequeueRequest{Batch: 1 + r.Intn(3), WaitMS: []int64{150, 1000, 4000, 20000}[r.Intn(4)]}
	if r.Intn(2) == 0 {
		req.Filter = m.filts[r.Intn(len(m.filts))]
	}
	if r.Intn(4) == 0 {
		req.LeaseMS = []int64{500, 5000}[r.Intn(2)]
	}
	if r.Intn(5) < 2 {
		m.ridN++
		req.RequestID = fmt.Sprintf("r%d", m.ridN)
	}
	now := m.now()
	what := fmt.Sprintf("dequeue %s %s (sent at t+%d)", q.name, js(req), now-t0.UnixMilli())
	fresh, _, want := m.expectDequeue(q, req, now)
	if want != "" || len(fresh) > 0 {
		// Answered at once.
		got, err := call[subjects.DequeueReply](m.e, subjects.OpDequeue, q.name, req)
		m.logf("%s -> %v %s", what, leaseList(got.Messages), js(err))
		m.checkCode(what, want, err)
		if err == nil {
			m.applyLeases(what, q, req, fresh, got.Messages, now)
		}
		m.after(q)
		return
	}
	inbox := m.e.nc.NewRespInbox()
	sub, err := m.e.nc.SubscribeSync(inbox)
	if err != nil {
		m.t.Fatal(err)
	}
	timers := m.e.clk.Pending()
	if err := m.e.nc.PublishRequest(m.e.space.Subject(subjects.OpDequeue, q.name), inbox, mustJSON(m.t, req)); err != nil {
		m.t.Fatal(err)
	}
	w := &mwaiter{q: q, req: req, deadline: now + req.WaitMS, sub: sub, what: what, sentAt: now}
	if req.RequestID != "" {
		q.reqs[req.RequestID] = &mreq{until: now + ridWindowMS, inFlight: true}
	}
	// It parks: its wait arms a timer on the fake clock.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.e.clk.WaitForTimers(ctx, timers+1); err != nil {
		if msg, err := sub.NextMsg(time.Second); err == nil {
			m.failf("%s: answered at once (%s) where nothing is eligible: want it to wait", what, msg.Data)
		}
		m.failf("%s: did not park (no timer armed) nor answer", what)
	}
	m.logf("%s parked", what)
	m.waiters = append(m.waiters, w)
	m.after(q)
}

// ---- browse ----

// opBrowse lists one state's messages and checks their order (protocol.md, browse: pending in
// EDF order, invisible by visible_at, running by lease_expires_at, finished by ended_at, then
// enqueue order).
func (m *model) opBrowse(q *mq) {
	m.stats["browse"]++
	r := m.rng
	state := subjects.States[r.Intn(len(subjects.States))]
	req := subjects.BrowseRequest{State: state, Limit: []int{0, 2, 5}[r.Intn(3)]}
	if r.Intn(3) == 0 {
		req.Filter = m.filts[r.Intn(len(m.filts))]
	}
	var xs []*mm
	for _, x := range q.msgs {
		if x.state == state && matchAll(x.md, req.Filter) {
			xs = append(xs, x)
		}
	}
	key := func(x *mm) int64 {
		switch state {
		case subjects.StatePending:
			return x.prio
		case subjects.StateInvisible:
			return x.visibleAt
		case subjects.StateRunning:
			return x.leaseExp
		}
		return x.endedAt
	}
	slices.SortFunc(xs, func(a, b *mm) int {
		if ka, kb := key(a), key(b); ka != kb {
			if ka < kb {
				return -1
			}
			return 1
		}
		return int(a.seq - b.seq)
	})
	limit := req.Limit
	if limit == 0 {
		limit = 50
	}
	more := len(xs) > limit
	xs = xs[:min(len(xs), limit)]
	got, err := call[subjects.BrowseReply](m.e, subjects.OpBrowse, q.name, req)
	m.logf("browse %s %s -> %v more %v %s", q.name, js(req), ids(got.Messages), got.More, js(err))
	what := fmt.Sprintf("browse %s %s", q.name, js(req))
	m.checkCode(what, "", err)
	if !slices.Equal(ids(got.Messages), mmIDs(xs)) || got.More != more {
		m.failf("%s: got %v more %v, want %v more %v", what, ids(got.Messages), got.More, mmIDs(xs), more)
	}
	for i, x := range xs {
		m.checkMsg(what, q, x, got.Messages[i], false)
	}
}

// TestRestartLeavesAnIdReused: a restart does not write the record of a message whose id a lock
// still names, taken for an earlier message of that id (leased, finished and collected): a lock of
// another value, or of another payload, cannot be for it, whose value and payload never change.
// Before, the start fenced the record, a version with no event, and an operator's cancel fenced by
// the version read before the restart was refused. (The model test found both.)
func TestRestartLeavesAnIdReused(t *testing.T) {
	t.Parallel()
	for _, value := range []string{"w", "v"} {
		t.Run("value "+value, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			e.create("x", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "p", LeaseMS: 60_000, RetentionMS: ptr[int64](1000)})
			e.enqueue("x", subjects.EnqueueRequest{ID: "a", Priority: ptr[int64](1), Metadata: subjects.Pairs{"p": "v"}})
			e.enqueue("x", subjects.EnqueueRequest{ID: "keep", Priority: ptr[int64](2), Metadata: subjects.Pairs{"p": "v"}}) // keeps value v's slot
			m := e.dequeueOne("x")
			must[subjects.Message](e, subjects.OpComplete, "x", subjects.LeaseRequest{ID: "a", LeaseID: m.LeaseID})
			e.advance(1100 * time.Millisecond) // a is collected
			fails(e, subjects.CodeMessageNotFound, subjects.OpGet, "x", subjects.GetRequest{ID: "a"})
			r := e.enqueue("x", subjects.EnqueueRequest{ID: "a", Priority: ptr[int64](1), Metadata: subjects.Pairs{"p": value}})
			if r.Duplicate || r.Version != 1 {
				t.Fatalf("enqueue a again: %+v", r)
			}
			e.restartBroker()
			if got := e.get("x", "a"); got.Version != 1 {
				t.Errorf("after a clean restart, a is at version %d, want 1 (nothing was written to it)", got.Version)
			}
			if _, err := call[subjects.Message](e, subjects.OpCancel, "x", subjects.LeaseRequest{ID: "a", Version: 1}); err != nil {
				t.Errorf("an operator's cancel at the version read before the restart: %v", err)
			}
		})
	}
}

// ---- abandon ----

const abandonedWindowMS = int64(30 * time.Second / time.Millisecond)

// opAbandon abandons a request id (a recent one, mostly): its dequeue's leases still held are
// given back with their attempts refunded, and a dequeue with it leases nothing while it is
// remembered (protocol.md, abandon).
func (m *model) opAbandon(q *mq) {
	m.stats["abandon"]++
	req := subjects.AbandonRequest{}
	var parked *mwaiter
	for _, w := range m.waiters {
		if w.q == q && w.req.RequestID != "" {
			parked = w
		}
	}
	switch {
	case parked != nil && m.rng.Intn(2) == 0:
		req.RequestID = parked.req.RequestID
	case len(q.rids) > 0 && m.rng.Intn(4) != 0:
		parked = nil
		req.RequestID = q.rids[m.rng.Intn(len(q.rids))]
	default:
		parked = nil
		m.ridN++
		req.RequestID = fmt.Sprintf("r%d", m.ridN) // one no dequeue sent (yet)
		q.rids = append(q.rids, req.RequestID)
		if len(q.rids) > 8 {
			q.rids = q.rids[1:]
		}
	}
	now := m.now()
	rec := q.reqs[req.RequestID]
	switch {
	case rec == nil || rec.until < now:
		rec = &mreq{until: now + abandonedWindowMS}
		q.reqs[req.RequestID] = rec
	case rec.until < now+abandonedWindowMS:
		rec.until = now + abandonedWindowMS
	}
	rec.gaveUp = true
	if parked != nil {
		// Its long poll ends at once, empty; the id stays remembered (5 minutes from the poll).
		rec.inFlight = false
		q.addRid(req.RequestID)
		m.waiters = slices.DeleteFunc(m.waiters, func(w *mwaiter) bool { return w == parked })
	}
	for _, l := range rec.leases {
		x := q.msgs[l.id]
		if x == nil || x.state != subjects.StateRunning || x.leaseID != l.lease {
			continue
		}
		x.released = true
		x.rid = ""
		if x.attempts > 0 {
			x.attempts--
		}
		visible(x, now, 0)
		q.stamp(x, now, subjects.StateRunning, subjects.EventReleased, subjects.ReasonRefunded)
		if !slices.Contains(rec.released, x.id) {
			rec.released = append(rec.released, x.id)
		}
	}
	if len(rec.released) > 1 && len(m.waiters) > 0 {
		// Abandon releases its leases one by one: a parked poll may be served after the first.
		m.ties = map[*mq][]map[*mm]subjects.State{}
		for k := 1; k < len(rec.released); k++ {
			as := map[*mm]subjects.State{}
			for _, id := range rec.released[k:] {
				as[q.msgs[id]] = subjects.StateRunning
			}
			m.ties[q] = append(m.ties[q], as)
		}
	}
	got, err := call[subjects.AbandonReply](m.e, subjects.OpAbandon, q.name, req)
	m.logf("abandon %s %s -> %s %s", q.name, js(req), js(got), js(err))
	what := fmt.Sprintf("abandon %s %s", q.name, js(req))
	m.checkCode(what, "", err)
	if got.RequestID != req.RequestID || !slices.Equal(got.Released, rec.released) && !(len(got.Released) == 0 && len(rec.released) == 0) {
		m.failf("%s: reply %s, want released %v", what, js(got), rec.released)
	}
	if parked != nil {
		rep, err := parked.reply(m)
		m.logf("%s -> (abandoned) %v %s", parked.what, leaseList(rep.Messages), js(err))
		m.checkCode(parked.what+" abandoned", "", err)
		if len(rep.Messages) != 0 {
			m.failf("%s: abandoned while parked, it got %v, want nothing", parked.what, leaseList(rep.Messages))
		}
		m.stats["long poll abandoned"]++
	}
	m.after(q)
	m.ties = nil
}

// ---- stats ----

// opStats checks stats' counts, oldest_pending_ms and expiring leases (protocol.md, stats).
func (m *model) opStats(q *mq) {
	m.stats["stats"]++
	r := m.rng
	req := subjects.StatsRequest{ExpiringWithinMS: []int64{0, 1000, 5000}[r.Intn(3)], ExpiringLimit: []int{0, 1, 3}[r.Intn(3)]}
	if r.Intn(3) == 0 {
		req.Filter = m.filts[r.Intn(len(m.filts))]
	}
	now := m.now()
	got, err := call[subjects.StatsReply](m.e, subjects.OpStats, q.name, req)
	m.logf("stats %s %s -> counts %+v oldest %d expiring %s %s", q.name, js(req), got.Counts, got.OldestPendingMS, js(got.Expiring), js(err))
	what := fmt.Sprintf("stats %s %s", q.name, js(req))
	m.checkCode(what, "", err)
	if want := q.counts(req.Filter); got.Counts != want {
		m.failf("%s: counts %+v, want %+v", what, got.Counts, want)
	}
	if got.Config != q.cfg {
		m.failf("%s: config %+v, want %+v", what, got.Config, q.cfg)
	}
	oldest := int64(-1)
	for _, x := range q.msgs {
		if x.state == subjects.StatePending && matchAll(x.md, req.Filter) && (oldest < 0 || x.visibleAt < oldest) {
			oldest = x.visibleAt
		}
	}
	switch {
	case oldest < 0:
		if got.OldestPendingMS != 0 {
			m.failf("%s: oldest_pending_ms %d with nothing pending", what, got.OldestPendingMS)
		}
	case len(req.Filter) > 0:
		if got.OldestPendingMS != now-oldest {
			m.failf("%s: oldest_pending_ms %d, want %d (exact with a filter)", what, got.OldestPendingMS, now-oldest)
		}
	default:
		// Counted from the start of the second it became pending: up to 999 ms more.
		if got.OldestPendingMS != now-oldest/1000*1000 {
			m.failf("%s: oldest_pending_ms %d, want %d (from the start of its second; exact %d)", what, got.OldestPendingMS, now-oldest/1000*1000, now-oldest)
		}
	}
	within := cmp.Or(req.ExpiringWithinMS, 30_000)
	limit := cmp.Or(req.ExpiringLimit, 20)
	var run []*mm
	for _, x := range q.msgs {
		if x.state == subjects.StateRunning && x.leaseExp <= now+within {
			run = append(run, x)
		}
	}
	slices.SortFunc(run, func(a, b *mm) int { return cmp.Or(cmp.Compare(a.leaseExp, b.leaseExp), cmp.Compare(a.seq, b.seq)) })
	run = run[:min(len(run), limit)]
	var want, gotL []string
	for _, x := range run {
		want = append(want, fmt.Sprintf("%s:%s:%d:%d/%d", x.id, x.leaseID, x.leaseExp-now, x.attempts, x.maxAttempts))
	}
	for _, l := range got.Expiring {
		gotL = append(gotL, fmt.Sprintf("%s:%s:%d:%d/%d", l.ID, l.LeaseID, l.ExpiresInMS, l.Attempts, l.MaxAttempts))
		if l.LeaseExpiresAt.UnixMilli()-now != l.ExpiresInMS {
			m.failf("%s: expiring %s: lease_expires_at and expires_in_ms disagree", what, l.ID)
		}
	}
	if !slices.Equal(want, gotL) {
		m.failf("%s: expiring %v, want %v", what, gotL, want)
	}
}

// ---- delete ----

// opDeleteRecreate deletes a queue with its messages, then creates it again as it was: its ids
// are free, its parked polls answered empty (protocol.md, delete).
func (m *model) opDeleteRecreate(q *mq) {
	m.stats["delete and create"]++
	got, err := call[subjects.DeleteReply](m.e, subjects.OpDelete, q.name, nil)
	m.logf("delete %s -> %s %s", q.name, js(got), js(err))
	m.checkCode("delete "+q.name, "", err)
	if got.Messages != len(q.msgs) {
		m.failf("delete %s: %d messages deleted, want %d", q.name, got.Messages, len(q.msgs))
	}
	kept := m.waiters[:0]
	for _, w := range m.waiters {
		if w.q != q {
			kept = append(kept, w)
			continue
		}
		rep, err := w.reply(m)
		m.logf("%s -> (queue deleted) %v %s", w.what, leaseList(rep.Messages), js(err))
		m.checkCode(w.what+" parked when its queue was deleted", "", err)
		if len(rep.Messages) != 0 {
			m.failf("%s: parked when its queue was deleted, it got %v, want nothing", w.what, leaseList(rep.Messages))
		}
	}
	clear(m.waiters[len(kept):])
	m.waiters = kept
	// A deleted message's history keeps its events, without a collected one.
	for id, x := range q.msgs {
		q.history[id] = x.events
	}
	q.msgs, q.reqs = map[string]*mm{}, map[string]*mreq{}
	fails(m.e, subjects.CodeQueueNotFound, subjects.OpGet, q.name, subjects.GetRequest{ID: "m00"})
	req := m.creates[slices.Index(m.qs, q)]
	info, err := call[subjects.QueueInfo](m.e, subjects.OpCreate, q.name, req)
	m.logf("create %s %s -> %s %s", q.name, js(req), js(info.Config), js(err))
	m.checkCode("create "+q.name+" again", "", err)
	cfg := q.cfg
	cfg.EnqueueBlocked, cfg.DequeueBlocked = false, false
	cfg.MaxRunning, cfg.MaxRunningPerValue, cfg.LeaseMS, cfg.MaxAttempts = req.MaxRunning, req.MaxRunningPerValue, req.LeaseMS, req.MaxAttempts
	cfg.MaxPayloadBytes, cfg.MaxMetadataPairs, cfg.InvisibleMS = 32768, 8, req.InvisibleMS
	q.cfg = cfg
	if info.Config != cfg {
		m.failf("create %s again: config %+v, want %+v", q.name, info.Config, cfg)
	}
	if info.Counts != (subjects.Counts{}) {
		m.failf("create %s again: counts %+v", q.name, info.Counts)
	}
	m.after(q)
}

func (m *model) locksNow() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kvb, err := m.e.jetStream().KeyValue(ctx, "natstone-locks")
	if err != nil {
		return err.Error()
	}
	keys, err := kvb.ListKeys(ctx)
	if err != nil {
		return err.Error()
	}
	var out []string
	for k := range keys.Keys() {
		v, err := kvb.Get(ctx, k)
		if err != nil {
			out = append(out, k+": "+err.Error())
			continue
		}
		out = append(out, fmt.Sprintf("%s@%d=%s", k, v.Revision(), v.Value()))
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

func (m *model) dumpLocks(queue, before string) {
	m.t.Logf("locks now:\n%s\n%s", m.locksNow(), before)
}

// ---- a reply that reaches nobody ----

// opDequeueToNobody sends a dequeue whose reply subject nobody listens on (a requester gone): what
// it leases is given back, pending again with its attempt refunded, and its request id is not
// remembered (protocol.md, dequeue: "A reply that reaches nobody gives its leases back").
func (m *model) opDequeueToNobody(q *mq) {
	if len(m.waiters) > 0 {
		m.opDequeue(q) // the give back would serve them at a moment the model does not know
		return
	}
	m.stats["dequeue to nobody"]++
	req := subjects.DequeueRequest{Batch: 1 + m.rng.Intn(3)}
	if m.rng.Intn(2) == 0 {
		m.ridN++
		req.RequestID = fmt.Sprintf("r%d", m.ridN)
	}
	now := m.now()
	fresh, replay, want := m.expectDequeue(q, req, now)
	if want != "" || replay != nil || len(fresh) == 0 {
		// Only a dequeue that leases is sent unanswered: waiting for its leases to come back is
		// what shows it was run (each operation has a subscription of its own, so a request that
		// gets no reply may be run after the next one).
		m.stats["dequeue to nobody"]--
		m.opDequeue(q)
		return
	}
	what := fmt.Sprintf("dequeue %s %s to an inbox nobody listens on", q.name, js(req))
	// Each message given back is released (an event), then pending again; nothing else of this
	// queue moves meanwhile (no clock advance, no parked poll).
	released := make(chan *nats.Msg, len(fresh))
	sub, err := m.e.nc.ChanSubscribe("natstone.events."+q.name+".released.>", released)
	if err != nil {
		m.t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := m.e.nc.PublishRequest(m.e.space.Subject(subjects.OpDequeue, q.name), m.e.nc.NewInbox(), mustJSON(m.t, req)); err != nil {
		m.t.Fatal(err)
	}
	if err := m.e.nc.Flush(); err != nil {
		m.t.Fatal(err)
	}
	m.logf("%s: expect %v leased and given back", what, mmIDs(fresh))
	deadline := time.After(10 * time.Second)
	for range fresh {
		select {
		case <-released:
		case <-deadline:
			m.failf("%s: %d of %v given back within 10 s", what, len(fresh)-len(released), mmIDs(fresh))
		}
	}
	for _, x := range fresh {
		got, err := call[subjects.Message](m.e, subjects.OpGet, q.name, subjects.GetRequest{ID: x.id})
		if err != nil || got.Version != x.version+2 || got.State != subjects.StatePending || got.LeaseID == "" || slices.Contains(x.leases, got.LeaseID) {
			m.failf("%s: %s after its give back: %s %v; want pending at version %d with a new lease id", what, x.id, js(got), err, x.version+2)
		}
		lease := got.LeaseID
		x.state, x.attempts, x.leaseID, x.leaseExp = subjects.StateRunning, x.attempts+1, lease, now+q.leaseFor(0, x)
		x.leases = append(x.leases, lease)
		x.rid, x.released = req.RequestID, false
		q.stamp(x, now, subjects.StatePending, subjects.EventLeased, "")
		x.released, x.rid, x.attempts = true, "", x.attempts-1
		visible(x, now, 0)
		q.stamp(x, now, subjects.StateRunning, subjects.EventReleased, subjects.ReasonRefunded)
		m.checkMsg(what+": given back", q, x, got, true)
	}
	m.stats["given back"] += len(fresh)
	m.logf("%s: given back %v", what, mmIDs(fresh))
	if req.RequestID != "" {
		delete(q.reqs, req.RequestID)
		q.addRid(req.RequestID) // not barred: a dequeue with it leases anew
	}
	m.after(q)
}
