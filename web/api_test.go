package web_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/test/brokertest"
	"github.com/natstone/natstone/test/natstest"
	"github.com/natstone/natstone/web"
	"github.com/natstone/natstone/workers"
)

// The replies of the API as a client reads them; decode refuses any field not listed here.
type (
	queueRow struct {
		Name            string             `json:"name"`
		Type            subjects.QueueType `json:"type"`
		ExclusivityKey  string             `json:"exclusivity_key"`
		EnqueueBlocked  bool               `json:"enqueue_blocked"`
		DequeueBlocked  bool               `json:"dequeue_blocked"`
		Counts          subjects.Counts    `json:"counts"`
		OldestPendingMS int64              `json:"oldest_pending_ms"`
		Rates           subjects.Rates     `json:"rates"`
	}
	queueList struct {
		Queues []queueRow `json:"queues"`
		Limit  int        `json:"limit"`
		More   bool       `json:"more"`
		Next   string     `json:"next"`
	}
	queueDetail struct {
		Name            string                   `json:"name"`
		Revision        uint64                   `json:"revision"`
		CreatedAt       time.Time                `json:"created_at"`
		Config          subjects.QueueConfig     `json:"config"`
		Filter          map[string]string        `json:"filter"`
		At              time.Time                `json:"at"`
		Counts          subjects.Counts          `json:"counts"`
		OldestPendingMS int64                    `json:"oldest_pending_ms"`
		Rates           subjects.Rates           `json:"rates"`
		Totals          subjects.Totals          `json:"totals"`
		Expiring        []subjects.ExpiringLease `json:"expiring"`
		Schedules       []subjects.ScheduleInfo  `json:"schedules"`
	}
	apiMessage struct {
		ID             string            `json:"id"`
		Queue          string            `json:"queue"`
		State          subjects.State    `json:"state"`
		Priority       int64             `json:"priority"`
		Metadata       map[string]string `json:"metadata"`
		Version        uint64            `json:"version"`
		Attempts       int               `json:"attempts"`
		AttemptsLeft   int               `json:"attempts_left"`
		LeaseID        string            `json:"lease_id"`
		LeaseExpiresAt *time.Time        `json:"lease_expires_at"`
		EnqueuedAt     time.Time         `json:"enqueued_at"`
		VisibleAt      time.Time         `json:"visible_at"`
		UpdatedAt      time.Time         `json:"updated_at"`
		EndedAt        *time.Time        `json:"ended_at"`
		PayloadSize    *int              `json:"payload_size"`
		Payload        *string           `json:"payload"`
		PayloadBase64  []byte            `json:"payload_base64"`
		PayloadOmitted bool              `json:"payload_omitted"`
	}
	messageList struct {
		Queue    string            `json:"queue"`
		State    subjects.State    `json:"state"`
		Filter   map[string]string `json:"filter"`
		Limit    int               `json:"limit"`
		Messages []apiMessage      `json:"messages"`
		More     bool              `json:"more"`
		Next     string            `json:"next"`
	}
	messageDetail struct {
		Message      *apiMessage            `json:"message"`
		History      *subjects.HistoryReply `json:"history"`
		HistoryError *subjects.Error        `json:"history_error"`
	}
)

func TestNewNeedsAClient(t *testing.T) {
	t.Parallel()
	if _, err := web.New(web.Config{}); err == nil || !strings.Contains(err.Error(), "Client") {
		t.Fatalf("New without a client: %v, want an error naming Config.Client", err)
	}
}

func TestQueues(t *testing.T) {
	t.Parallel()
	e := setup(t)

	var empty queueList
	e.get("/api/queues", &empty)
	if empty.Queues == nil || len(empty.Queues) != 0 {
		t.Fatalf("no queues: got %+v, want an empty list", empty)
	}

	e.createQueue("beta", &workers.QueueOpts{DequeueBlocked: true})
	e.createQueue("alpha", &workers.QueueOpts{Type: subjects.Exclusive, ExclusivityKey: "project"})
	for i, p := range []string{"foo", "foo", "bar"} {
		e.enqueue("alpha", "a"+string(rune('1'+i)), int64(i), "x", map[string]string{"project": p})
	}
	e.enqueue("beta", "b1", 1, "x", nil)
	m := e.dequeue("alpha", 1, "w")[0]
	if _, err := e.c.Complete(ctx(t), "alpha", m.ID, m.LeaseID); err != nil {
		t.Fatal(err)
	}
	e.dequeue("alpha", 1, "w")

	var got queueList
	e.get("/api/queues", &got)
	if len(got.Queues) != 2 || got.Queues[0].Name != "alpha" || got.Queues[1].Name != "beta" {
		t.Fatalf("queues %+v, want alpha and beta in that order", got.Queues)
	}
	for _, q := range got.Queues {
		st := e.stats(q.Name, nil)
		if q.Counts != st.Counts {
			t.Errorf("%s: counts %+v, stats say %+v", q.Name, q.Counts, st.Counts)
		}
		if q.Type != st.Config.Type || q.ExclusivityKey != st.Config.ExclusivityKey ||
			q.EnqueueBlocked != st.Config.EnqueueBlocked || q.DequeueBlocked != st.Config.DequeueBlocked {
			t.Errorf("%s: %+v does not show the config %+v", q.Name, q, st.Config)
		}
		if q.Rates.Enqueued <= 0 || q.OldestPendingMS < 0 {
			t.Errorf("%s: rates %+v, oldest pending %d ms: want enqueues counted", q.Name, q.Rates, q.OldestPendingMS)
		}
	}
	alpha := got.Queues[0]
	if want := (subjects.Counts{Pending: 1, Running: 1, Completed: 1}); alpha.Counts != want {
		t.Errorf("alpha counts %+v, want %+v", alpha.Counts, want)
	}
	if alpha.Type != subjects.Exclusive || alpha.ExclusivityKey != "project" || alpha.Rates.Completed <= 0 {
		t.Errorf("alpha %+v: want exclusive by project with completions", alpha)
	}
	if !got.Queues[1].DequeueBlocked || got.Queues[1].EnqueueBlocked {
		t.Errorf("beta %+v: want dequeue blocked only", got.Queues[1])
	}

	if got.Limit != web.QueuesPage || got.More || got.Next != "" {
		t.Errorf("the list of two queues: limit %d, more %v, next %q; want the default page, whole", got.Limit, got.More, got.Next)
	}

	status, h, body := e.do(http.MethodGet, "/api/queues?x=1", "", "")
	wantError(t, "unknown parameter", status, h, body, http.StatusBadRequest, subjects.CodeBadRequest)
	for q, code := range map[string]subjects.Code{
		"limit=0": subjects.CodeOutOfRange, fmt.Sprintf("limit=%d", web.MaxQueuesPage+1): subjects.CodeOutOfRange,
		"limit=two": subjects.CodeBadRequest, "after=bad.name": subjects.CodeInvalidQueueName,
	} {
		status, h, body := e.do(http.MethodGet, "/api/queues?"+q, "", "")
		wantError(t, q, status, h, body, http.StatusBadRequest, code)
	}
}

// TestQueuesPages: the list comes in pages, each after the last queue of the one before, so that a
// broker of thousands of queues is not asked the stats of every one at each refresh.
func TestQueuesPages(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		e.createQueue(name, nil)
	}
	var names []string
	for after, pages := "", 0; ; pages++ {
		var page queueList
		e.get("/api/queues?limit=2&after="+after, &page)
		if page.Limit != 2 || len(page.Queues) > 2 || pages > 3 {
			t.Fatalf("page %d after %q: %+v, want at most 2 queues", pages, after, page)
		}
		for _, q := range page.Queues {
			names = append(names, q.Name)
		}
		if !page.More {
			if page.Next != "" {
				t.Fatalf("the last page says next %q", page.Next)
			}
			break
		}
		if page.Next != page.Queues[len(page.Queues)-1].Name {
			t.Fatalf("page %d: next %q, want its last queue", pages, page.Next)
		}
		after = page.Next
	}
	if !slices.Equal(names, []string{"a", "b", "c", "d", "e"}) {
		t.Fatalf("the pages listed %v, want a to e once each", names)
	}
}

func TestQueue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	info := e.createQueue("q", &workers.QueueOpts{Lease: 10 * time.Second, MaxAttempts: 3})
	e.enqueue("q", "m1", 1, "x", map[string]string{"kind": "a"})
	e.enqueue("q", "m2", 2, "x", map[string]string{"kind": "a"})
	e.enqueue("q", "m3", 3, "x", map[string]string{"kind": "b"})
	leased := e.dequeue("q", 1, "w")[0]

	var got queueDetail
	e.get("/api/queues/q", &got)
	st := e.stats("q", nil)
	if got.Name != "q" || got.Revision != info.Revision || !got.CreatedAt.Equal(info.CreatedAt) || got.Config != info.Config {
		t.Errorf("queue %+v, want the info %+v", got, info)
	}
	if got.Counts != st.Counts || got.Counts != (subjects.Counts{Pending: 2, Running: 1}) {
		t.Errorf("counts %+v, stats say %+v", got.Counts, st.Counts)
	}
	if got.Totals.Enqueued != 3 || got.Totals.Dequeued != 1 || got.Rates.Dequeued <= 0 || got.At.IsZero() || got.Filter != nil {
		t.Errorf("totals %+v, rates %+v, at %v, filter %v", got.Totals, got.Rates, got.At, got.Filter)
	}
	if len(got.Expiring) != 1 || got.Expiring[0].ID != leased.ID || got.Expiring[0].LeaseID != leased.LeaseID || got.Expiring[0].MaxAttempts != 3 {
		t.Errorf("expiring %+v, want the lease of %s", got.Expiring, leased.ID)
	}

	if got.Schedules == nil || len(got.Schedules) != 0 {
		t.Errorf("schedules %v, want [] (none, as an empty list)", got.Schedules)
	}
	if _, err := e.c.Schedule(ctx(t), "q", "nightly", workers.ScheduleOpts{Cron: "0 2 * * *"}); err != nil {
		t.Fatal(err)
	}
	var scheduled queueDetail
	e.get("/api/queues/q", &scheduled)
	if len(scheduled.Schedules) != 1 || scheduled.Schedules[0].Name != "nightly" || scheduled.Schedules[0].Cron != "0 2 * * *" || scheduled.Schedules[0].NextAt.IsZero() {
		t.Errorf("schedules %+v, want nightly with its next fire", scheduled.Schedules)
	}

	var filtered queueDetail
	e.get("/api/queues/q?filter=kind=b", &filtered)
	want := e.stats("q", map[string]string{"kind": "b"})
	if filtered.Counts != want.Counts || filtered.Counts.Pending != 1 || filtered.Filter["kind"] != "b" {
		t.Errorf("filtered %+v, %v; stats say %+v", filtered.Counts, filtered.Filter, want.Counts)
	}

	var none queueDetail
	e.get("/api/queues/q?filter=kind=nothing", &none)
	if none.Counts != (subjects.Counts{}) || none.Expiring == nil {
		t.Errorf("a filter matching nothing: counts %+v, expiring %v", none.Counts, none.Expiring)
	}

	status, h, body := e.do(http.MethodGet, "/api/queues/nope", "", "")
	wantError(t, "unknown queue", status, h, body, http.StatusNotFound, subjects.CodeQueueNotFound)
	status, h, body = e.do(http.MethodGet, "/api/queues/bad.name", "", "")
	wantError(t, "invalid name", status, h, body, http.StatusBadRequest, subjects.CodeInvalidQueueName)
}

func TestMessages(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	kinds := []string{"a", "b", "a", "b", "a", "a"}
	for i, k := range kinds {
		// Priorities out of enqueue order: the listing must follow them, not the enqueues.
		e.enqueue("q", "m"+string(rune('0'+i)), int64(100-i*10), "payload", map[string]string{"kind": k, "region": []string{"eu", "us"}[i%2]})
	}
	running := e.dequeue("q", 1, "w")[0]

	check := func(query string, state subjects.State, filter map[string]string, limit int) messageList {
		t.Helper()
		var got messageList
		e.get("/api/queues/q/messages"+query, &got)
		want := e.browse("q", state, filter)
		ids := make([]string, len(got.Messages))
		for i, m := range got.Messages {
			ids[i] = m.ID
			if m.Queue != "q" || m.State != state || m.Payload != nil || m.PayloadSize != nil || m.EnqueuedAt.IsZero() || m.Metadata["kind"] == "" {
				t.Errorf("%s: message %+v", query, m)
			}
		}
		if n := min(len(want), limit); !slices.Equal(ids, want[:n]) || got.More != (len(want) > limit) {
			t.Errorf("%s: ids %v (more %v), browse says %v", query, ids, got.More, want)
		}
		if got.Queue != "q" || got.State != state || got.Limit != limit || len(got.Filter) != len(filter) {
			t.Errorf("%s: reply %+v", query, got)
		}
		return got
	}
	check("", subjects.StatePending, nil, 50)
	check("?state=pending&limit=2", subjects.StatePending, nil, 2)
	check("?filter=kind=a", subjects.StatePending, map[string]string{"kind": "a"}, 50)
	check("?filter=kind%3Da&filter=region=us&limit=1000", subjects.StatePending, map[string]string{"kind": "a", "region": "us"}, 1000)
	check("?state=completed", subjects.StateCompleted, nil, 50)
	got := check("?state=running", subjects.StateRunning, nil, 50)
	if len(got.Messages) != 1 || got.Messages[0].LeaseID != running.LeaseID || got.Messages[0].LeaseExpiresAt == nil || got.Messages[0].Attempts != 1 {
		t.Errorf("running %+v, want the lease %s", got.Messages, running.LeaseID)
	}

	// Pages: each after the next of the one before, together the whole list, the last without more.
	var paged []string
	after := ""
	for page := 0; ; page++ {
		var got messageList
		e.get("/api/queues/q/messages?limit=2&after="+url.QueryEscape(after), &got)
		for _, m := range got.Messages {
			paged = append(paged, m.ID)
		}
		if got.More != (got.Next != "") {
			t.Fatalf("page %d: more %v with next %q", page, got.More, got.Next)
		}
		if !got.More {
			break
		}
		after = got.Next
	}
	if want := e.browse("q", subjects.StatePending, nil); !slices.Equal(paged, want) {
		t.Errorf("the pages of 2: %v, browse says %v", paged, want)
	}
	status, h, body := e.do(http.MethodGet, "/api/queues/q/messages?after=not-a-cursor", "", "")
	wantError(t, "a made-up after", status, h, body, http.StatusBadRequest, subjects.CodeBadRequest)

	status, h, body = e.do(http.MethodGet, "/api/queues/nope/messages", "", "")
	wantError(t, "unknown queue", status, h, body, http.StatusNotFound, subjects.CodeQueueNotFound)
}

// TestBadInput checks that every kind of bad input is refused with 400 before the broker is asked.
func TestBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	e.enqueue("q", "m", 1, "x", nil)
	reqs := e.watch("q", subjects.OpStats, subjects.OpInfo, subjects.OpBrowse, subjects.OpGet, subjects.OpHistory)

	long := strings.Repeat("k", subjects.MaxMetadataKeyLen+1)
	for _, c := range []struct {
		query string
		code  subjects.Code
	}{
		{"?state=bogus", subjects.CodeBadRequest},
		{"?limit=0", subjects.CodeOutOfRange},
		{"?limit=1001", subjects.CodeOutOfRange},
		{"?limit=-1", subjects.CodeOutOfRange},
		{"?limit=ten", subjects.CodeBadRequest},
		{"?limit=1&limit=2", subjects.CodeBadRequest},
		{"?state=pending&state=running", subjects.CodeBadRequest},
		{"?filter=nokey", subjects.CodeBadRequest},
		{"?filter==v", subjects.CodeBadRequest},
		{"?filter=", subjects.CodeBadRequest},
		{"?filter=k=1&filter=k=2", subjects.CodeBadRequest},
		{"?filter=" + long + "=v", subjects.CodeInvalidMetadata},
		{"?filter=k=%01", subjects.CodeInvalidMetadata},
		{"?sort=priority", subjects.CodeBadRequest},
		{"?filter=%zz", subjects.CodeBadRequest},
	} {
		status, h, body := e.do(http.MethodGet, "/api/queues/q/messages"+c.query, "", "")
		wantError(t, "messages"+c.query, status, h, body, http.StatusBadRequest, c.code)
	}
	for _, path := range []string{"/api/queues/q?filter=x", "/api/queues/q?limit=5", "/api/queues/q/messages/m?full=1"} {
		status, h, body := e.do(http.MethodGet, path, "", "")
		wantError(t, path, status, h, body, http.StatusBadRequest, subjects.CodeBadRequest)
	}
	if n := reqs.count(); n != 0 {
		t.Errorf("%d requests reached the broker, want none", n)
	}
	// The same routes with good input do reach it: the watch sees requests.
	var list messageList
	e.get("/api/queues/q/messages?filter=k=v", &list)
	if n := reqs.count(); n != 1 {
		t.Errorf("a good request: %d requests seen, want 1", n)
	}
}

func TestMessage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	e.enqueue("q", "small", 1, `hello <b>"world"</b>`, map[string]string{"kind": "a"})
	big := strings.Repeat("z", web.MaxPayloadPreview+1)
	e.enqueue("q", "big", 2, big, nil)
	edge := strings.Repeat("y", web.MaxPayloadPreview)
	e.enqueue("q", "edge", 3, edge, nil)
	e.enqueue("q", "a/b c?#%", 4, "odd id", nil)
	e.enqueue("q", "..", 6, "dots", nil)
	if _, err := e.c.Enqueue(ctx(t), "q", []byte{0xff, 0x00, 0x01}, &workers.EnqueueOpts{ID: "bin", Priority: ptr(int64(5))}); err != nil {
		t.Fatal(err)
	}
	m := e.dequeue("q", 1, "worker-7")[0] // small
	if _, err := e.c.Release(ctx(t), "q", m.ID, m.LeaseID, nil); err != nil {
		t.Fatal(err)
	}
	m = e.dequeue("q", 1, "worker-8")[0]
	if _, err := e.c.Complete(ctx(t), "q", m.ID, m.LeaseID); err != nil {
		t.Fatal(err)
	}

	var got messageDetail
	e.get("/api/queues/q/messages/small", &got)
	if got.Message == nil || got.Message.ID != "small" || got.Message.State != subjects.StateCompleted || got.Message.EndedAt == nil ||
		got.Message.Payload == nil || *got.Message.Payload != `hello <b>"world"</b>` || *got.Message.PayloadSize != 20 || got.Message.Attempts != 2 {
		t.Errorf("small: %+v", got.Message)
	}
	want := e.history("q", "small")
	if got.History == nil || got.HistoryError != nil {
		t.Fatalf("small: history %+v, error %+v", got.History, got.HistoryError)
	}
	if kinds(got.History.Events) != "enqueued leased released leased completed" || kinds(want.Events) != kinds(got.History.Events) {
		t.Errorf("small: events %s, history says %s", kinds(got.History.Events), kinds(want.Events))
	}
	if got.History.Failures != 1 || got.History.Events[1].Worker != "worker-7" || got.History.Events[3].Worker != "worker-8" {
		t.Errorf("small: failures %d, events %+v", got.History.Failures, got.History.Events)
	}

	for _, c := range []struct {
		id      string
		payload *string
		base64  []byte
		size    int
		omitted bool
	}{
		{id: "big", size: len(big), omitted: true},
		{id: "edge", payload: &edge, size: len(edge)},
		{id: "bin", base64: []byte{0xff, 0x00, 0x01}, size: 3},
		{id: "a/b c?#%", payload: ptr("odd id"), size: 6},
		{id: "..", payload: ptr("dots"), size: 4}, // the query form only: a path loses it
	} {
		paths := []string{"/api/queues/q/message?id=" + url.QueryEscape(c.id)}
		if c.id != ".." {
			paths = append(paths, "/api/queues/q/messages/"+url.PathEscape(c.id))
		}
		for _, path := range paths {
			var d messageDetail
			e.get(path, &d)
			if d.Message == nil || d.Message.ID != c.id || d.History == nil || len(d.History.Events) != 1 {
				t.Errorf("%s: %+v", path, d)
				continue
			}
			if !equalPtr(d.Message.Payload, c.payload) || string(d.Message.PayloadBase64) != string(c.base64) ||
				*d.Message.PayloadSize != c.size || d.Message.PayloadOmitted != c.omitted {
				t.Errorf("%s: payload %v, base64 %v, size %d, omitted %v", path, d.Message.Payload, d.Message.PayloadBase64, *d.Message.PayloadSize, d.Message.PayloadOmitted)
			}
		}
	}
	for _, path := range []string{"/api/queues/q/message", "/api/queues/q/message?id=", "/api/queues/q/message?id=a&id=b", "/api/queues/q/message?id=a&x=1"} {
		status, h, body := e.do(http.MethodGet, path, "", "")
		wantError(t, path, status, h, body, http.StatusBadRequest, subjects.CodeBadRequest)
	}

	status, h, body := e.do(http.MethodGet, "/api/queues/q/messages/nope", "", "")
	wantError(t, "unknown message", status, h, body, http.StatusNotFound, subjects.CodeMessageNotFound)
	if status, _, body := e.do(http.MethodGet, "/api/queues/nope/messages/small", "", ""); status != http.StatusNotFound {
		t.Errorf("unknown queue: status %d, want 404: %s", status, body)
	}
}

// TestMessageCollected checks that a garbage-collected message is still shown from its history.
func TestMessageCollected(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("gc", &workers.QueueOpts{Retention: ptr(time.Duration(0))})
	e.enqueue("gc", "m", 1, "x", map[string]string{"kind": "a"})
	m := e.dequeue("gc", 1, "w")[0]
	if _, err := e.c.Complete(ctx(t), "gc", m.ID, m.LeaseID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the message to be collected", func() bool {
		_, err := e.c.Get(ctx(t), "gc", "m")
		return errors.Is(err, workers.ErrMessageNotFound)
	})
	var got messageDetail
	e.get("/api/queues/gc/messages/m", &got)
	if got.Message != nil || got.History == nil || !got.History.Collected {
		t.Fatalf("collected: %+v", got)
	}
	if k := kinds(got.History.Events); k != "enqueued leased completed collected" {
		t.Errorf("collected: events %s", k)
	}
}

// TestMessageWithoutEvents checks a broker without the events stream: the message is shown, its
// history is reported missing.
func TestMessageWithoutEvents(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *broker.Config) { c.DisableEvents = true })
	e.enqueue("q", "m", 1, "x", nil)
	var got messageDetail
	e.get("/api/queues/q/messages/m", &got)
	if got.Message == nil || got.History != nil || got.HistoryError == nil || got.HistoryError.Code != subjects.CodeUnavailable {
		t.Errorf("without events: %+v", got)
	}
	status, h, body := e.do(http.MethodGet, "/api/queues/q/messages/nope", "", "")
	wantError(t, "unknown message without events", status, h, body, http.StatusNotFound, subjects.CodeMessageNotFound)
}

func TestBlocked(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)

	var info subjects.QueueInfo
	e.post("/api/queues/q/blocked", `{"dequeue_blocked":true}`, &info)
	got, err := e.c.Queue(ctx(t), "q")
	if err != nil {
		t.Fatal(err)
	}
	if !got.Config.DequeueBlocked || got.Config.EnqueueBlocked || info.Config != got.Config || info.Revision != got.Revision {
		t.Errorf("after dequeue_blocked: reply %+v, queue %+v", info.Config, got.Config)
	}
	if _, err := e.c.Dequeue(ctx(t), "q", nil); !errors.Is(err, workers.ErrQueueBlocked) {
		t.Errorf("dequeue of a blocked queue: %v, want ErrQueueBlocked", err)
	}

	status, h, body := e.do(http.MethodPost, "/api/queues/q/blocked", "application/json; charset=utf-8", `{"enqueue_blocked":true,"dequeue_blocked":false}`)
	if status != http.StatusOK {
		t.Fatalf("both flags: status %d: %s", status, body)
	}
	decode(t, h, body, &info)
	if got, _ = e.c.Queue(ctx(t), "q"); !got.Config.EnqueueBlocked || got.Config.DequeueBlocked {
		t.Errorf("after both flags: %+v", got.Config)
	}

	// Bad requests change nothing and never reach the broker.
	reqs := e.watch("q", subjects.OpUpdate, subjects.OpInfo)
	for _, c := range []struct {
		name, contentType, body string
		status                  int
	}{
		{"no content type", "", `{"dequeue_blocked":true}`, http.StatusUnsupportedMediaType},
		{"a form", "application/x-www-form-urlencoded", `dequeue_blocked=true`, http.StatusUnsupportedMediaType},
		{"plain text", "text/plain", `{"dequeue_blocked":true}`, http.StatusUnsupportedMediaType},
		{"bad media type", "application/json;;", `{"dequeue_blocked":true}`, http.StatusUnsupportedMediaType},
		{"empty body", "application/json", ``, http.StatusBadRequest},
		{"no flag", "application/json", `{}`, http.StatusBadRequest},
		{"null", "application/json", `null`, http.StatusBadRequest},
		{"unknown field", "application/json", `{"dequeue_blocked":true,"lease_ms":5}`, http.StatusBadRequest},
		{"wrong type", "application/json", `{"dequeue_blocked":"yes"}`, http.StatusBadRequest},
		{"trailing data", "application/json", `{"dequeue_blocked":true} {}`, http.StatusBadRequest},
		{"truncated", "application/json", `{"dequeue_blocked":tr`, http.StatusBadRequest},
		{"an array", "application/json", `[true]`, http.StatusBadRequest},
		{"too large", "application/json", `{"dequeue_blocked":true}` + strings.Repeat(" ", 2<<10), http.StatusRequestEntityTooLarge},
	} {
		status, h, body := e.do(http.MethodPost, "/api/queues/q/blocked", c.contentType, c.body)
		wantError(t, c.name, status, h, body, c.status, subjects.CodeBadRequest)
	}
	if n := reqs.count(); n != 0 {
		t.Errorf("%d requests reached the broker, want none", n)
	}
	if after, _ := e.c.Queue(ctx(t), "q"); after.Revision != got.Revision || after.Config != got.Config {
		t.Errorf("bad requests changed the queue: %+v, was %+v", after, got)
	}

	status, h, body = e.do(http.MethodPost, "/api/queues/nope/blocked", "application/json", `{"dequeue_blocked":true}`)
	wantError(t, "unknown queue", status, h, body, http.StatusNotFound, subjects.CodeQueueNotFound)
	if status, _, _ := e.do(http.MethodGet, "/api/queues/q/blocked", "", ""); status != http.StatusMethodNotAllowed {
		t.Errorf("GET of the blocked route: status %d, want 405", status)
	}
	if status, _, _ := e.do(http.MethodDelete, "/api/queues/q", "", ""); status != http.StatusMethodNotAllowed {
		t.Errorf("DELETE of a queue: status %d, want 405", status)
	}
}

// TestRetryMessage: POST /api/queues/{name}/retry retries an errored or canceled message at the
// version the page showed; bad bodies never reach the broker.
func TestRetryMessage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	e.enqueue("q", "m", 1, "x", nil)
	canceled, err := e.c.Cancel(ctx(t), "q", "m", "")
	if err != nil {
		t.Fatal(err)
	}

	reqs := e.watch("q", subjects.OpRetry)
	for _, c := range []struct {
		name, contentType, body string
		status                  int
	}{
		{"plain text", "text/plain", `{"id":"m","version":2}`, http.StatusUnsupportedMediaType},
		{"empty body", "application/json", ``, http.StatusBadRequest},
		{"no version", "application/json", `{"id":"m"}`, http.StatusBadRequest},
		{"no id", "application/json", `{"version":2}`, http.StatusBadRequest},
		{"unknown field", "application/json", `{"id":"m","version":2,"delay_ms":5}`, http.StatusBadRequest},
		{"negative version", "application/json", `{"id":"m","version":-1}`, http.StatusBadRequest},
		// What encoding/json alone takes for another id: U+FFFD, the last of two.
		{"not UTF-8", "application/json", "{\"id\":\"\xff\",\"version\":2}", http.StatusBadRequest},
		{"a lone surrogate", "application/json", `{"id":"m\ud800","version":2}`, http.StatusBadRequest},
		{"id twice", "application/json", `{"id":"nope","id":"m","version":2}`, http.StatusBadRequest},
	} {
		status, h, body := e.do(http.MethodPost, "/api/queues/q/retry", c.contentType, c.body)
		wantError(t, c.name, status, h, body, c.status, subjects.CodeBadRequest)
	}
	if n := reqs.count(); n != 0 {
		t.Errorf("%d requests reached the broker, want none", n)
	}

	status, h, body := e.do(http.MethodPost, "/api/queues/q/retry", "application/json", fmt.Sprintf(`{"id":"m","version":%d}`, canceled.Version+1))
	wantError(t, "another version", status, h, body, http.StatusConflict, subjects.CodeRevisionMismatch)
	var m subjects.Message
	e.post("/api/queues/q/retry", fmt.Sprintf(`{"id":"m","version":%d}`, canceled.Version), &m)
	if m.State != subjects.StatePending || m.Attempts != 0 || m.Version != canceled.Version+1 {
		t.Errorf("retried: %+v, want pending at the next version", m)
	}
	status, h, body = e.do(http.MethodPost, "/api/queues/q/retry", "application/json", `{"id":"nope","version":1}`)
	wantError(t, "unknown message", status, h, body, http.StatusNotFound, subjects.CodeMessageNotFound)
}

// TestRescheduleMessage: POST /api/queues/{name}/reschedule reschedules a waiting message at the
// version the page showed; bad bodies never reach the broker.
func TestRescheduleMessage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	if _, err := e.c.Enqueue(ctx(t), "q", []byte("x"), &workers.EnqueueOpts{ID: "m", Invisible: time.Hour}); err != nil {
		t.Fatal(err)
	}

	reqs := e.watch("q", subjects.OpReschedule)
	for _, c := range []struct {
		name, contentType, body string
		status                  int
		code                    subjects.Code
	}{
		{"plain text", "text/plain", `{"id":"m","version":1,"delay_ms":0}`, http.StatusUnsupportedMediaType, subjects.CodeBadRequest},
		{"no version", "application/json", `{"id":"m","delay_ms":0}`, http.StatusBadRequest, subjects.CodeBadRequest},
		{"no change", "application/json", `{"id":"m","version":1}`, http.StatusBadRequest, subjects.CodeBadRequest},
		{"unknown field", "application/json", `{"id":"m","version":1,"delay_ms":0,"lease_ms":5}`, http.StatusBadRequest, subjects.CodeBadRequest},
		{"negative delay", "application/json", `{"id":"m","version":1,"delay_ms":-1}`, http.StatusBadRequest, subjects.CodeOutOfRange},
		{"a delay that overflows a Duration", "application/json", `{"id":"m","version":1,"delay_ms":9223372036854775807}`, http.StatusBadRequest, subjects.CodeOutOfRange},
	} {
		status, h, body := e.do(http.MethodPost, "/api/queues/q/reschedule", c.contentType, c.body)
		wantError(t, c.name, status, h, body, c.status, c.code)
	}
	if n := reqs.count(); n != 0 {
		t.Errorf("%d requests reached the broker, want none", n)
	}

	status, h, body := e.do(http.MethodPost, "/api/queues/q/reschedule", "application/json", `{"id":"m","version":2,"delay_ms":0}`)
	wantError(t, "another version", status, h, body, http.StatusConflict, subjects.CodeRevisionMismatch)
	var m subjects.Message
	e.post("/api/queues/q/reschedule", `{"id":"m","version":1,"delay_ms":0,"priority":7}`, &m)
	if m.State != subjects.StatePending || m.Priority != 7 || m.Version != 2 {
		t.Errorf("rescheduled: %+v, want pending at priority 7, version 2", m)
	}
}

// TestCancelMessage: POST /api/queues/{name}/cancel cancels a message at the version the page
// showed, and nothing it became since; bad bodies never reach the broker.
func TestCancelMessage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	e.enqueue("q", "m", 1, "x", nil)
	reqs := e.watch("q", subjects.OpCancel)
	for _, c := range []struct{ name, body string }{
		{"no version", `{"id":"m"}`},
		{"no id", `{"version":1}`},
		{"a lease id", `{"id":"m","version":1,"lease_id":"L"}`},
	} {
		status, h, body := e.do(http.MethodPost, "/api/queues/q/cancel", "application/json", c.body)
		wantError(t, c.name, status, h, body, http.StatusBadRequest, subjects.CodeBadRequest)
	}
	if n := reqs.count(); n != 0 {
		t.Errorf("%d requests reached the broker, want none", n)
	}
	leased := e.dequeue("q", 1, "w")[0]
	status, h, body := e.do(http.MethodPost, "/api/queues/q/cancel", "application/json", `{"id":"m","version":1}`)
	wantError(t, "the version before the lease", status, h, body, http.StatusConflict, subjects.CodeRevisionMismatch)
	var m subjects.Message
	e.post("/api/queues/q/cancel", fmt.Sprintf(`{"id":"m","version":%d}`, leased.Version), &m)
	if m.State != subjects.StateCanceled || m.Version != leased.Version+1 {
		t.Errorf("canceled: %+v, want canceled at the next version", m)
	}
}

// TestScheduleActions: POST /api/queues/{name}/schedules/{schedule}/pause, /resume and /fire
// pause a schedule with a note, fire it now by the id given, and resume it; bad bodies never reach
// the broker, and a schedule that does not exist is 404 schedule_not_found.
func TestScheduleActions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createQueue("q", nil)
	if _, err := e.c.Schedule(ctx(t), "q", "nightly", workers.ScheduleOpts{Cron: "0 2 * * *", Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	reqs := e.watch("q", subjects.OpSchedulePause, subjects.OpScheduleResume, subjects.OpScheduleFire)
	for _, c := range []struct {
		name, path, contentType, body string
		status                        int
		code                          subjects.Code
	}{
		{"plain text", "pause", "text/plain", `{}`, http.StatusUnsupportedMediaType, subjects.CodeBadRequest},
		{"empty body", "pause", "application/json", ``, http.StatusBadRequest, subjects.CodeBadRequest},
		{"unknown field", "resume", "application/json", `{"paused":true}`, http.StatusBadRequest, subjects.CodeBadRequest},
		{"a note to fire", "fire", "application/json", `{"note":"x"}`, http.StatusBadRequest, subjects.CodeBadRequest},
		// As the broker refuses it: taken for none, each retry would fire again.
		{"an empty id", "fire", "application/json", `{"id":""}`, http.StatusBadRequest, subjects.CodeInvalidID},
	} {
		status, h, body := e.do(http.MethodPost, "/api/queues/q/schedules/nightly/"+c.path, c.contentType, c.body)
		wantError(t, c.name, status, h, body, c.status, c.code)
	}
	if n := reqs.count(); n != 0 {
		t.Errorf("%d requests reached the broker, want none", n)
	}
	status, h, body := e.do(http.MethodPost, "/api/queues/q/schedules/none/pause", "application/json", `{}`)
	wantError(t, "no such schedule", status, h, body, http.StatusNotFound, subjects.CodeScheduleNotFound)

	var info subjects.ScheduleInfo
	e.post("/api/queues/q/schedules/nightly/pause", `{"note":"maintenance"}`, &info)
	if !info.Paused || info.Note != "maintenance" {
		t.Errorf("paused: %+v, want paused with its note", info)
	}
	e.post("/api/queues/q/schedules/nightly/fire", `{"id":"by-hand"}`, &info)
	if info.LastID != "by-hand" {
		t.Errorf("fired: %+v, want last_id by-hand", info)
	}
	if m, err := e.c.Get(ctx(t), "q", "by-hand"); err != nil || m.State != subjects.StatePending {
		t.Errorf("the message fired: %+v, %v; want pending", m, err)
	}
	var resumed subjects.ScheduleInfo
	e.post("/api/queues/q/schedules/nightly/resume", `{}`, &resumed)
	if resumed.Paused || resumed.Note != "" || resumed.PausedAt != nil {
		t.Errorf("resumed: %+v, want not paused, no note", resumed)
	}
}

// TestUnavailable checks that a broker that does not answer gives 503 unavailable.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil) // no broker: requests find no responders
	e := serve(t, srv, &workers.Config{Timeout: 2 * time.Second})
	for _, path := range []string{"/api/queues", "/api/queues/q", "/api/queues/q/messages", "/api/queues/q/messages/m"} {
		status, h, body := e.do(http.MethodGet, path, "", "")
		wantError(t, path, status, h, body, http.StatusServiceUnavailable, subjects.CodeUnavailable)
	}
	status, h, body := e.do(http.MethodPost, "/api/queues/q/blocked", "application/json", `{"enqueue_blocked":true}`)
	wantError(t, "blocked", status, h, body, http.StatusServiceUnavailable, subjects.CodeUnavailable)
}

// TestDashboardFiles checks the static files: served with their types, the security headers, and
// nothing that would load from another origin.
func TestDashboardFiles(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	e := serve(t, srv, nil)
	for _, c := range []struct{ path, contentType, contains string }{
		{"/", "text/html; charset=utf-8", `<script src="app.js" defer></script>`},
		{"/app.js", "text/javascript; charset=utf-8", "'use strict';"},
		{"/style.css", "text/css; charset=utf-8", ":root"},
	} {
		status, h, body := e.do(http.MethodGet, c.path, "", "")
		if status != http.StatusOK || h.Get("Content-Type") != c.contentType || !strings.Contains(string(body), c.contains) {
			t.Errorf("GET %s: status %d, type %q, %d bytes", c.path, status, h.Get("Content-Type"), len(body))
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", c.path, csp)
		}
		if h.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: no nosniff", c.path)
		}
		for _, ext := range []string{"http://", "https://", "innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("} {
			if strings.Contains(string(body), ext) {
				t.Errorf("GET %s: contains %q", c.path, ext)
			}
		}
	}
	if status, _, _ := e.do(http.MethodGet, "/nope.js", "", ""); status != http.StatusNotFound {
		t.Errorf("GET /nope.js: status %d, want 404", status)
	}
	if status, _, _ := e.do(http.MethodGet, "/metrics", "", ""); status != http.StatusNotFound {
		t.Errorf("GET /metrics without a metrics handler: status %d, want 404", status)
	}
}

func TestMetricsAndHealth(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	c, err := workers.NewClient(srv.Connect(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	text := func(s string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(s)) })
	}
	s, err := web.New(web.Config{Client: c, Metrics: text("metrics"), Health: text("ok"), Ready: text("ready")})
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{"/metrics": "metrics", "/healthz": "ok", "/readyz": "ready"} {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK || rec.Body.String() != want {
			t.Errorf("GET %s: %d %q, want %q", path, rec.Code, rec.Body.String(), want)
		}
	}
}

// kinds lists the kinds of events, space-separated.
func kinds(events []subjects.HistoryEvent) string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = string(e.Kind)
	}
	return strings.Join(out, " ")
}

func equalPtr[T comparable](a, b *T) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// TestForeignRequestsRefused: a POST from a page of another origin is refused (cross-site request
// forgery), and with Hosts set, so is any request naming another host (a page of another site
// whose name was made to resolve to the listener's address: DNS rebinding). Neither reaches the
// broker; the dashboard's own requests and clients without a browser's headers still work.
func TestForeignRequestsRefused(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	brokertest.Start(t, srv, func(c *broker.Config) { c.MemoryStorage = true })
	c, err := workers.NewClient(srv.Connect(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateQueue(ctx(t), "q", nil); err != nil {
		t.Fatal(err)
	}
	s, err := web.New(web.Config{Client: c, Logger: discard(), Hosts: []string{"localhost", "127.0.0.1", "::1"}})
	if err != nil {
		t.Fatal(err)
	}
	send := func(method, host string, header map[string]string) int {
		t.Helper()
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(`{"dequeue_blocked":true}`)
		}
		req := httptest.NewRequest(method, "http://"+host+"/api/queues/q", body)
		if method == http.MethodPost {
			req = httptest.NewRequest(method, "http://"+host+"/api/queues/q/blocked", body)
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			// A refusal is an API error, as every failed request's is.
			wantError(t, method+" "+host, rec.Code, rec.Header(), rec.Body.Bytes(), rec.Code, subjects.CodeBadRequest)
		}
		return rec.Code
	}
	for _, tc := range []struct {
		name, method, host string
		header             map[string]string
		want               int
	}{
		{"rebound name", http.MethodGet, "attacker.example:8080", nil, http.StatusMisdirectedRequest},
		{"rebound name, POST", http.MethodPost, "attacker.example:8080", map[string]string{"Sec-Fetch-Site": "same-origin"}, http.StatusMisdirectedRequest},
		{"cross-site POST", http.MethodPost, "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"cross-origin POST, older browser", http.MethodPost, "127.0.0.1:8080", map[string]string{"Origin": "http://attacker.example"}, http.StatusForbidden},
		{"the dashboard's GET", http.MethodGet, "localhost:8080", map[string]string{"Sec-Fetch-Site": "same-origin"}, http.StatusOK},
		{"IPv6 loopback", http.MethodGet, "[::1]:8080", nil, http.StatusOK},
		// Another site's page cannot make its readers' browsers call the API (fetch, img, iframe)...
		{"cross-site fetch", http.MethodGet, "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "empty"}, http.StatusForbidden},
		{"same-site fetch", http.MethodGet, "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}, http.StatusForbidden},
		{"cross-site image", http.MethodGet, "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}, http.StatusForbidden},
		{"cross-site iframe", http.MethodGet, "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"}, http.StatusForbidden},
		{"cross-site window navigated by script", http.MethodGet, "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, http.StatusForbidden},
		// ...but it may link to it.
		{"cross-site link followed", http.MethodGet, "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document", "Sec-Fetch-User": "?1"}, http.StatusOK},
		{"address typed in", http.MethodGet, "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, http.StatusOK},
	} {
		if got := send(tc.method, tc.host, tc.header); got != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, got, tc.want)
		}
	}
	if q, err := c.Queue(ctx(t), "q"); err != nil || q.Config.DequeueBlocked {
		t.Fatalf("after the refused POSTs: %+v, %v; want dequeue not blocked", q.Config, err)
	}
	for name, header := range map[string]map[string]string{
		"the dashboard's POST": {"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1:8080"},
		"curl's POST":          nil,
	} {
		if got := send(http.MethodPost, "127.0.0.1:8080", header); got != http.StatusOK {
			t.Errorf("%s: status %d, want 200", name, got)
		}
	}
}

// TestHostsOfAnExposedListener: a listener on a non-loopback address (AnyIP) answers to its IP
// addresses and the names it is known by, and still refuses any other name: DNS rebinding needs one.
func TestHostsOfAnExposedListener(t *testing.T) {
	t.Parallel()
	e := setup(t) // for its client
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	s, err := web.New(web.Config{Client: e.c, Logger: discard(), Hosts: []string{"localhost", "dash.corp"}, AnyIP: true, Metrics: ok, Health: ok, Ready: ok})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]int{
		"10.1.2.3:8080":          http.StatusOK,
		"[fe80::1]:8080":         http.StatusOK,
		"[fe80::1%eth0]:8080":    http.StatusOK,
		"10.1.2.3":               http.StatusOK,
		"DASH.corp:8080":         http.StatusOK,
		"localhost:8080":         http.StatusOK,
		"localhost.:8080":        http.StatusOK,
		"":                       http.StatusOK, // HTTP/1.0: no browser
		"attacker.example:8080":  http.StatusMisdirectedRequest,
		"10.1.2.3.nip.io:8080":   http.StatusMisdirectedRequest,
		"attacker.example.:8080": http.StatusMisdirectedRequest,
	} {
		req := httptest.NewRequest(http.MethodGet, "/api/queues", nil)
		req.Host = host
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("Host %q: status %d, want %d", host, rec.Code, want)
		}
	}
	// Machines scrape /metrics and probe /healthz and /readyz by whatever name they know the listener by.
	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Host = "natstone.monitoring.svc:8080"
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Errorf("GET %s by a service name: status %d, want 200", path, rec.Code)
		}
	}
}
