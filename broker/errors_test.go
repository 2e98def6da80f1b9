package broker_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/subjects"
)

// The tests in this file pin the error contract: every bad request gets a stable error code, the
// micro service error headers and a message, and writes nothing (the queue list, the storage
// streams and the messages it names are as they were).

const (
	maxLeaseMS     = int64(24 * time.Hour / time.Millisecond)
	maxWaitMS      = int64(5 * time.Minute / time.Millisecond)
	maxInvisibleMS = int64(366 * 24 * time.Hour / time.Millisecond)
	maxRetentionMS = int64(90 * 24 * time.Hour / time.Millisecond)
)

func TestErrInvalidQueueNameInSubject(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("ok", subjects.CreateQueueRequest{})
	e.enqueue("ok", subjects.EnqueueRequest{ID: "m1", Payload: "x"})
	watch := []msgRef{{"ok", "m1"}}

	// Names that are one valid NATS subject token, so the broker's <op>.* endpoints receive them.
	names := []string{
		strings.Repeat("q", subjects.MaxQueueNameLen+1),
		strings.Repeat("q", 1000),
		"é", "a:b", "a+b", "a%b", "a/b", `a\b`, "a@b", "a~b", "日本",
	}
	bodies := map[subjects.Op]any{
		subjects.OpCreate:       subjects.CreateQueueRequest{},
		subjects.OpUpdate:       subjects.UpdateQueueRequest{LeaseMS: ptr(int64(1000))},
		subjects.OpEnqueue:      subjects.EnqueueRequest{ID: "n1", Payload: "x"},
		subjects.OpEnqueueBatch: subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{{Payload: "x"}}},
		subjects.OpEnqueueRaw:   "x",
		subjects.OpDequeue:      subjects.DequeueRequest{},
		subjects.OpComplete:     subjects.LeaseRequest{ID: "m1", LeaseID: "L"},
		subjects.OpExtend:       subjects.ExtendRequest{ID: "m1", LeaseID: "L"},
		subjects.OpRelease:      subjects.ReleaseRequest{ID: "m1", LeaseID: "L"},
		subjects.OpCancel:       subjects.LeaseRequest{ID: "m1"},
		subjects.OpRetry:        subjects.RetryRequest{ID: "m1"},
		subjects.OpReschedule:   subjects.RescheduleRequest{ID: "m1", Priority: ptr(int64(1))},
		subjects.OpGet:          subjects.GetRequest{ID: "m1"},
		subjects.OpDepth:        subjects.DepthRequest{},
		subjects.OpSchedule:     subjects.ScheduleRequest{Name: "s", Cron: "@hourly"},
		subjects.OpUnschedule:   subjects.UnscheduleRequest{Name: "s"},
	}
	var cases []errCase
	for _, name := range names {
		for _, op := range subjects.Ops {
			if op == subjects.OpList {
				continue
			}
			label := name
			if len(label) > 10 {
				label = fmt.Sprintf("%d-chars", len(name))
			}
			cases = append(cases, errCase{op: op, queue: name, body: bodies[op], code: subjects.CodeInvalidQueueName,
				name: fmt.Sprintf("%s/%s", op, label)})
		}
	}
	runErrCases(t, e, watch, cases)

	// The longest valid name works.
	name := strings.Repeat("q", subjects.MaxQueueNameLen)
	e.create(name, subjects.CreateQueueRequest{})
	e.enqueue(name, subjects.EnqueueRequest{Payload: "x"})
	if c := e.depth(name, nil); c.Pending != 1 {
		t.Fatalf("depth of the 128-char queue = %+v", c)
	}
}

// TestErrInvalidQueueNameRawSubjects sends subjects that do not have the <prefix>.<op>.<queue>
// shape: a dotted name, wildcards, an empty token. No endpoint may answer them with success, and no
// queue may appear.
func TestErrInvalidQueueNameRawSubjects(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("a", subjects.CreateQueueRequest{})
	tests := []string{
		"natstone.v1.enqueue.a.b",
		"natstone.v1.create.a.b",
		"natstone.v1.enqueue_raw.a.b.c",
		"natstone.v1.enqueue_batch.a.b",
		"natstone.v1.dequeue.a.b",
		"natstone.v1.delete.a.b",
		"natstone.v1.list.a",
		"natstone.v1.enqueue.*",
		"natstone.v1.create.*",
		"natstone.v1.create.>",
		"natstone.v1.enqueue.",
		"natstone.v1.create..a",
		"natstone.v1.create",
		"natstone.v1.enqueue",
	}
	bodies := map[string][]byte{
		"natstone.v1.enqueue_batch.a.b": []byte(`{"messages":[{"payload":"x"}]}`),
	}
	for _, subj := range tests {
		t.Run(subj, func(t *testing.T) {
			se := e.on(t)
			before := se.snap()
			body, ok := bodies[subj]
			if !ok {
				body = []byte(`{}`)
			}
			msg, err := se.nc.Request(subj, body, 10*time.Second)
			switch {
			case errors.Is(err, nats.ErrNoResponders):
				t.Logf("%s: no responders", subj)
			case err != nil:
				t.Errorf("%s: %v; want an error reply or no responders", subj, err)
			default:
				er := se.checkErrReply(msg, "", subj)
				if er != nil {
					t.Logf("%s: error reply %s: %s", subj, er.Code, er.Message)
					if er.Code != subjects.CodeInvalidQueueName && er.Code != subjects.CodeBadRequest {
						t.Errorf("%s: code %s, want invalid_queue_name or bad_request", subj, er.Code)
					}
				}
			}
			se.unchanged(before)
		})
	}
	// The queue "a" is still the only one, untouched.
	if qs := must[subjects.ListReply](e, subjects.OpList, "", nil).Queues; len(qs) != 1 || qs[0].Name != "a" || qs[0].Counts != (subjects.Counts{}) {
		t.Fatalf("queues = %+v", qs)
	}
}

// TestErrReplyHeaders checks the micro service error headers of an error of each status.
func TestErrReplyHeaders(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("small", subjects.CreateQueueRequest{MaxPayloadBytes: 1})
	tests := []struct {
		op     subjects.Op
		queue  string
		body   any
		code   subjects.Code
		status string
	}{
		{subjects.OpInfo, "ghost", nil, subjects.CodeQueueNotFound, "404"},
		{subjects.OpGet, "small", subjects.GetRequest{ID: "nope"}, subjects.CodeMessageNotFound, "404"},
		{subjects.OpCreate, "small", subjects.CreateQueueRequest{LeaseMS: 1000}, subjects.CodeQueueExists, "409"},
		{subjects.OpEnqueue, "small", subjects.EnqueueRequest{Payload: "xx"}, subjects.CodePayloadTooLarge, "413"},
		{subjects.OpEnqueue, "small", "{", subjects.CodeBadRequest, "400"},
		{subjects.OpDequeue, "small", subjects.DequeueRequest{Batch: -1}, subjects.CodeOutOfRange, "400"},
	}
	for _, tc := range tests {
		t.Run(string(tc.code), func(t *testing.T) {
			msg := e.on(t).request(tc.op, tc.queue, tc.body)
			if got := msg.Header.Get("Nats-Service-Error-Code"); got != tc.status {
				t.Errorf("Nats-Service-Error-Code = %q, want %q", got, tc.status)
			}
			desc := msg.Header.Get("Nats-Service-Error")
			if strings.TrimSpace(desc) == "" {
				t.Errorf("Nats-Service-Error header is empty (headers %v)", msg.Header)
			}
			var er subjects.ErrorReply
			if err := json.Unmarshal(msg.Data, &er); err != nil || er.Error == nil {
				t.Fatalf("body %q: %v", msg.Data, err)
			}
			if er.Error.Code != tc.code {
				t.Errorf("code = %s, want %s", er.Error.Code, tc.code)
			}
			if er.Error.Message == "" || er.Error.Message != desc {
				t.Errorf("message %q, header %q: want the same, non-empty", er.Error.Message, desc)
			}
			t.Logf("%s %s: %s", tc.status, er.Error.Code, er.Error.Message)
		})
	}
}

// TestErrMalformedJSON sends malformed, unknown-field, trailing-data and wrongly typed bodies to
// every JSON operation.
func TestErrMalformedJSON(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.enqueue("q", subjects.EnqueueRequest{ID: "r1", Payload: "running"})
	lease := e.dequeueOne("q").LeaseID
	e.enqueue("q", subjects.EnqueueRequest{ID: "m1", Payload: "pending"})
	watch := []msgRef{{"q", "r1"}, {"q", "m1"}}

	generic := []string{
		`{`,
		`{"nope":1}`,
		`{} {}`,
		`{}x`,
		`{}}`,
		`[]`,
		`"x"`,
		`1`,
		`nul`,
		`{"a":}`,
		"\x00",
		"{\"id\":\"m\xff1\"}", // not UTF-8: read as another id were it decoded anyway
	}
	ops := []subjects.Op{
		subjects.OpCreate, subjects.OpInfo, subjects.OpUpdate, subjects.OpDelete,
		subjects.OpEnqueue, subjects.OpEnqueueBatch, subjects.OpDequeue,
		subjects.OpComplete, subjects.OpExtend, subjects.OpRelease, subjects.OpCancel, subjects.OpRetry,
		subjects.OpReschedule, subjects.OpGet, subjects.OpDepth,
	}
	var cases []errCase
	for _, op := range ops {
		for i, body := range generic {
			cases = append(cases, errCase{name: fmt.Sprintf("%s/generic%d", op, i), op: op, queue: "q", body: body, code: subjects.CodeBadRequest})
		}
	}
	specific := map[subjects.Op][]string{
		subjects.OpCreate: {`{"type":1}`, `{"lease_ms":"1"}`, `{"retention_ms":1.5}`, `{"enqueue_blocked":"true"}`,
			`{"max_attempts":1e3}`, `{"name":"q"}`, `{"revision":1}`},
		subjects.OpUpdate: {`{"revision":-1}`, `{"lease_ms":"x"}`, `{"enqueue_blocked":1}`, `{"max_payload_bytes":1.5}`},
		subjects.OpEnqueue: {`{"priority":"1"}`, `{"metadata":{"a":1}}`, `{"metadata":["a"]}`, `{"payload_base64":"!!"}`,
			`{"payload":5}`, `{"invisible_ms":1.5}`, `{"lease_ms":"100"}`, `{"id":7}`, `{"priority":9223372036854775808}`,
			`{"payload":"x","state":"pending"}`, `{"payload":"x","metadata":{"a":"b","k":null}}`},
		subjects.OpEnqueueBatch: {`{"messages":{}}`, `{"messages":[{"nope":1}]}`, `{"messages":[1]}`,
			`{"messages":[{"payload":"a"}],"x":1}`, `{"messages":[{"payload":"a"},{"priority":"x"}]}`, `{"messages":"a"}`,
			`{"messages":[{"payload":"a"},{"metadata":{"k":null}}]}`, `{"messages":[{"payload":"a"},null]}`},
		subjects.OpDequeue: {`{"batch":"1"}`, `{"lease_ms":1e3}`, `{"filter":["a"]}`, `{"wait_ms":true}`, `{"request_id":1}`, `{"filter":{"k":null}}`},
		subjects.OpComplete: {`{"id":"r1","lease_id":5}`, `{"id":["r1"]}`, `{"id":"r1","lease_id":"` + lease + `","state":"completed"}`,
			`{"id":"r1","lease_id":"` + lease + `","version":2}`},
		subjects.OpExtend:  {`{"id":"r1","lease_id":"` + lease + `","lease_ms":"1000"}`, `{"id":"r1","lease_id":"` + lease + `","delay_ms":1}`},
		subjects.OpRelease: {`{"id":"r1","lease_id":"` + lease + `","delay_ms":true}`, `{"id":"r1","lease_id":"` + lease + `","lease_ms":100}`},
		subjects.OpCancel:  {`{"id":"m1","state":"canceled"}`, `{"id":1}`, `{"id":"m1","version":-1}`, `{"id":"m1","version":"1"}`},
		subjects.OpRetry:   {`{"id":"m1","version":-1}`, `{"id":"m1","delay_ms":"1"}`, `{"id":"m1","lease_id":"x"}`, `{"id":"m1","version":1.5}`},
		subjects.OpReschedule: {`{"id":"m1","priority":"1"}`, `{"id":"m1","delay_ms":1.5}`, `{"id":"m1","priority":9223372036854775808}`,
			`{"id":"m1","priority":1,"state":"pending"}`, `{"id":"m1","priority":1,"version":-1}`},
		subjects.OpGet:    {`{"id":1}`, `{"id":"m1","lease_id":"x"}`},
		subjects.OpDepth:  {`{"filter":{"a":1}}`, `{"filter":"a"}`, `{"queue":"q"}`, `{"filter":{"a":null}}`},
		subjects.OpInfo:   {`{"name":"q"}`},
		subjects.OpDelete: {`{"name":"q"}`, `{"force":true}`},
	}
	for op, bodies := range specific {
		for i, body := range bodies {
			cases = append(cases, errCase{name: fmt.Sprintf("%s/specific%d", op, i), op: op, queue: "q", body: body, code: subjects.CodeBadRequest})
		}
	}
	// A malformed enqueue to an unknown queue fails before auto-creating it.
	for i, body := range []string{`{`, `{"nope":1}`, `{"payload":5}`} {
		cases = append(cases, errCase{name: fmt.Sprintf("enqueue-unknown-queue/%d", i), op: subjects.OpEnqueue, queue: "fresh", body: body, code: subjects.CodeBadRequest})
		cases = append(cases, errCase{name: fmt.Sprintf("enqueue_batch-unknown-queue/%d", i), op: subjects.OpEnqueueBatch, queue: "fresh",
			body: `{"messages":[` + body + `]}`, code: subjects.CodeBadRequest})
	}
	runErrCases(t, e, watch, cases)

	// The good lease still works: nothing above touched the messages.
	c := must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "r1", LeaseID: lease})
	if c.State != subjects.StateCompleted || c.Version != 3 {
		t.Fatalf("complete after the bad requests: %+v", c)
	}
}

// TestErrListMalformedBody: list takes an optional body (after, limit); a malformed one, or one with
// fields list does not know, is a bad request.
func TestErrListMalformedBody(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	for i, body := range []string{`{`, `{"nope":1}`, `[]`, `{}x`} {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			e.on(t).fail(subjects.CodeBadRequest, subjects.OpList, "", body)
		})
	}
}

func TestErrPayloadBothForms(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	runErrCases(t, e, nil, []errCase{
		{"enqueue", subjects.OpEnqueue, "q", `{"payload":"a","payload_base64":"YQ=="}`, subjects.CodeBadRequest},
		{"enqueue struct", subjects.OpEnqueue, "q", subjects.EnqueueRequest{ID: "x", Payload: "a", PayloadBase64: []byte{0xff}}, subjects.CodeBadRequest},
		{"batch", subjects.OpEnqueueBatch, "q", `{"messages":[{"payload":"a"},{"payload":"a","payload_base64":"YQ=="}]}`, subjects.CodeBadRequest},
	})
	if c := e.depth("q", nil); c != (subjects.Counts{}) {
		t.Fatalf("depth = %+v, want zero", c)
	}
}

// TestErrRawEnqueueHeaders sends enqueue_raw requests with bad Natstone-* headers.
func TestErrRawEnqueueHeaders(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{MaxMetadataPairs: 2})
	tests := []struct {
		name  string
		queue string
		hdr   map[string]string
		code  subjects.Code
	}{
		{"priority word", "q", map[string]string{subjects.HeaderPriority: "abc"}, subjects.CodeBadRequest},
		{"priority float", "q", map[string]string{subjects.HeaderPriority: "1.5"}, subjects.CodeBadRequest},
		{"priority empty", "q", map[string]string{subjects.HeaderPriority: ""}, subjects.CodeBadRequest},
		{"priority overflow", "q", map[string]string{subjects.HeaderPriority: "9223372036854775808"}, subjects.CodeBadRequest},
		{"priority hex", "q", map[string]string{subjects.HeaderPriority: "0x10"}, subjects.CodeBadRequest},
		{"priority exponent", "q", map[string]string{subjects.HeaderPriority: "1e3"}, subjects.CodeBadRequest},
		{"invisible word", "q", map[string]string{subjects.HeaderInvisibleMS: "soon"}, subjects.CodeBadRequest},
		{"lease duration", "q", map[string]string{subjects.HeaderLeaseMS: "1s"}, subjects.CodeBadRequest},
		{"metadata truncated", "q", map[string]string{subjects.HeaderMetadata: `{`}, subjects.CodeBadRequest},
		{"metadata number value", "q", map[string]string{subjects.HeaderMetadata: `{"a":1}`}, subjects.CodeBadRequest},
		{"metadata array", "q", map[string]string{subjects.HeaderMetadata: `["a"]`}, subjects.CodeBadRequest},
		{"metadata string", "q", map[string]string{subjects.HeaderMetadata: `"a"`}, subjects.CodeBadRequest},
		{"metadata trailing", "q", map[string]string{subjects.HeaderMetadata: `{"a":"b"} x`}, subjects.CodeBadRequest},
		{"metadata not JSON", "q", map[string]string{subjects.HeaderMetadata: `a=b`}, subjects.CodeBadRequest},
		{"metadata null value", "q", map[string]string{subjects.HeaderMetadata: `{"a":null}`}, subjects.CodeBadRequest},
		{"priority plus sign", "q", map[string]string{subjects.HeaderPriority: "+5"}, subjects.CodeBadRequest},
		{"bad header, good others", "q", map[string]string{subjects.HeaderID: "m1", subjects.HeaderPriority: "5", subjects.HeaderLeaseMS: "x"}, subjects.CodeBadRequest},
		{"misspelled header", "q", map[string]string{"Natstone-Lease": "5000"}, subjects.CodeBadRequest},
		{"metadata not UTF-8", "q", map[string]string{subjects.HeaderMetadata: "{\"a\":\"\xff\"}"}, subjects.CodeBadRequest},
		{"bad header unknown queue", "fresh", map[string]string{subjects.HeaderPriority: "x"}, subjects.CodeBadRequest},
		{"metadata control char", "q", map[string]string{subjects.HeaderMetadata: `{"a\u0001":"v"}`}, subjects.CodeInvalidMetadata},
		{"metadata too many pairs", "q", map[string]string{subjects.HeaderMetadata: `{"a":"1","b":"2","c":"3"}`}, subjects.CodeInvalidMetadata},
		{"metadata empty key", "q", map[string]string{subjects.HeaderMetadata: `{"":"v"}`}, subjects.CodeInvalidMetadata},
		{"id too long", "q", map[string]string{subjects.HeaderID: strings.Repeat("i", subjects.MaxIDLen+1)}, subjects.CodeInvalidID},
		{"invisible negative", "q", map[string]string{subjects.HeaderInvisibleMS: "-1"}, subjects.CodeOutOfRange},
		{"invisible too long", "q", map[string]string{subjects.HeaderInvisibleMS: strconv.FormatInt(maxInvisibleMS+1, 10)}, subjects.CodeOutOfRange},
		{"lease too short", "q", map[string]string{subjects.HeaderLeaseMS: "99"}, subjects.CodeOutOfRange},
		{"lease too long", "q", map[string]string{subjects.HeaderLeaseMS: strconv.FormatInt(maxLeaseMS+1, 10)}, subjects.CodeOutOfRange},
		{"max attempts word", "q", map[string]string{subjects.HeaderMaxAttempts: "three"}, subjects.CodeBadRequest},
		{"max attempts 0", "q", map[string]string{subjects.HeaderMaxAttempts: "0"}, subjects.CodeOutOfRange},
		{"max attempts too many", "q", map[string]string{subjects.HeaderMaxAttempts: "1001"}, subjects.CodeOutOfRange},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			se := e.on(t)
			before := se.snap()
			se.checkErrReply(se.raw(tc.queue, tc.hdr, []byte("payload")), tc.code, tc.name)
			se.unchanged(before)
		})
	}
	if c := e.depth("q", nil); c != (subjects.Counts{}) {
		t.Fatalf("depth = %+v, want zero", c)
	}
	// The same headers with good values work.
	r := e.rawOK("q", map[string]string{subjects.HeaderID: "m1", subjects.HeaderPriority: "5", subjects.HeaderLeaseMS: "100",
		subjects.HeaderInvisibleMS: "0", subjects.HeaderMetadata: `{"a":"1","b":"2"}`, subjects.HeaderMaxAttempts: "2"}, []byte("payload"))
	if r.ID != "m1" || r.Priority != 5 || r.State != subjects.StatePending {
		t.Fatalf("raw enqueue: %+v", r)
	}
	if m := e.get("q", "m1"); m.AttemptsLeft != 2 {
		t.Fatalf("raw enqueue with %s 2: %d attempts left", subjects.HeaderMaxAttempts, m.AttemptsLeft)
	}
}

// TestErrRawEnqueueHeaderCase: the contract says header names are case-insensitive, so a bad value
// under a lower- or upper-case name must be rejected like under the canonical name (not ignored).
// TestErrRawEnqueueMalformedHeaderBlock sends header blocks nats.go cannot decode, over the raw
// protocol (nats.go will not write them): it delivers such a message without headers, which must
// not enqueue the payload without its id and attributes.
func TestErrRawEnqueueMalformedHeaderBlock(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r := bufio.NewReader(conn)
	if _, err := r.ReadString('\n'); err != nil { // INFO
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, "CONNECT {\"verbose\":false,\"headers\":true}\r\n"); err != nil {
		t.Fatal(err)
	}
	replies := make(chan *nats.Msg, 8)
	sub, err := e.nc.ChanSubscribe(nats.NewInbox()+".>", replies)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	subj := e.space.Subject(subjects.OpEnqueueRaw, "q")
	for i, hdr := range []string{
		"NATS/1.0\r\nNatstone-Id: m1\r\nNatstone-Priority 5\r\n\r\n", // a line without a colon
		"NATS/1.0\r\nNatstone-Lease-Ms: 5\r\nbroken\r\n\r\n",
		"FOO/1.0\r\nNatstone-Lease-Ms: 5\r\n\r\n",      // not a NATS header block
		"NATS/1.0\r\n Natstone-Id: m1\r\n\r\n",         // a continuation line with nothing to continue: the name " Natstone-Id"
		"NATS/1.0\r\nX: a\r\n Natstone-Id: m1\r\n\r\n", // a continuation line
		"NATS/1.0\r\nNatstone Id: m1\r\n\r\n",          // a space in the name
	} {
		reply := strings.TrimSuffix(sub.Subject, ">") + strconv.Itoa(i)
		body := "payload"
		frame := fmt.Sprintf("HPUB %s %s %d %d\r\n%s%s\r\nPING\r\n", subj, reply, len(hdr), len(hdr)+len(body), hdr, body)
		if _, err := io.WriteString(conn, frame); err != nil {
			t.Fatal(err)
		}
		for line := ""; line != "PONG\r\n"; {
			if line, err = r.ReadString('\n'); err != nil {
				t.Fatalf("header block %d: %v (the server closed the connection?)", i, err)
			}
		}
		select {
		case m := <-replies:
			e.checkErrReply(m, subjects.CodeBadRequest, fmt.Sprintf("header block %q", hdr))
		case <-time.After(10 * time.Second):
			t.Fatalf("header block %q: no reply", hdr)
		}
	}
	if c := e.depth("q", nil); c != (subjects.Counts{}) {
		t.Fatalf("depth = %+v, want nothing enqueued", c)
	}
}

func TestErrRawEnqueueHeaderCase(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	tests := []struct {
		name string
		hdr  map[string]string
	}{
		{"lower priority", map[string]string{"natstone-priority": "abc"}},
		{"upper priority", map[string]string{"NATSTONE-PRIORITY": "abc"}},
		{"lower metadata", map[string]string{"natstone-metadata": "{"}},
		{"lower lease", map[string]string{"natstone-lease-ms": "1s"}},
		{"mixed invisible", map[string]string{"NatStone-Invisible-MS": "soon"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			se := e.on(t)
			before := se.snap()
			se.checkErrReply(se.raw("q", tc.hdr, []byte("payload")), subjects.CodeBadRequest, tc.name)
			se.unchanged(before)
		})
	}
}

func TestErrPayloadTooLarge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("small", subjects.CreateQueueRequest{MaxPayloadBytes: 16})
	at := strings.Repeat("a", 16)
	over := strings.Repeat("a", 17)

	// At the limit: accepted, in every form.
	e.enqueue("small", subjects.EnqueueRequest{ID: "json", Payload: at})
	e.enqueue("small", subjects.EnqueueRequest{ID: "b64", PayloadBase64: []byte(at)})
	e.enqueue("small", subjects.EnqueueRequest{ID: "utf8", Payload: strings.Repeat("é", 8)}) // 16 bytes
	e.rawOK("small", map[string]string{subjects.HeaderID: "raw"}, []byte(at))
	must[subjects.EnqueueBatchReply](e, subjects.OpEnqueueBatch, "small", subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{
		{ID: "batch1", Payload: at}, {ID: "batch2", PayloadBase64: []byte(at)},
	}})
	want := subjects.Counts{Pending: 6}
	if c := e.depth("small", nil); c != want {
		t.Fatalf("depth = %+v, want %+v", c, want)
	}

	// An id the queue holds is a duplicate whatever the queue's limits (which may have been lowered
	// since it was stored: TestErrEnqueueRetryAfterLimitsLowered).
	before := e.snap(msgRef{"small", "json"})
	if r := e.enqueue("small", subjects.EnqueueRequest{ID: "json", Payload: over}); !r.Duplicate {
		t.Fatalf("a stored id with a payload over the limit: %+v, want duplicate", r)
	}
	e.unchanged(before)
	runErrCases(t, e, []msgRef{{"small", "json"}}, []errCase{
		{"json", subjects.OpEnqueue, "small", subjects.EnqueueRequest{ID: "x", Payload: over}, subjects.CodePayloadTooLarge},
		{"json no id", subjects.OpEnqueue, "small", subjects.EnqueueRequest{Payload: over}, subjects.CodePayloadTooLarge},
		{"base64", subjects.OpEnqueue, "small", subjects.EnqueueRequest{ID: "x", PayloadBase64: []byte(over)}, subjects.CodePayloadTooLarge},
		{"binary base64", subjects.OpEnqueue, "small", subjects.EnqueueRequest{ID: "x", PayloadBase64: make([]byte, 17)}, subjects.CodePayloadTooLarge},
		{"utf8 bytes not runes", subjects.OpEnqueue, "small", subjects.EnqueueRequest{ID: "x", Payload: strings.Repeat("é", 8) + "a"}, subjects.CodePayloadTooLarge},
		{"way over", subjects.OpEnqueue, "small", subjects.EnqueueRequest{ID: "x", Payload: strings.Repeat("a", 100_000)}, subjects.CodePayloadTooLarge},
		{"batch", subjects.OpEnqueueBatch, "small", subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{
			{ID: "y1", Payload: at}, {ID: "y2", Payload: at}, {ID: "y3", Payload: over},
		}}, subjects.CodePayloadTooLarge},
	})
	t.Run("raw", func(t *testing.T) {
		se := e.on(t)
		before := se.snap()
		se.checkErrReply(se.raw("small", map[string]string{subjects.HeaderID: "x"}, []byte(over)), subjects.CodePayloadTooLarge, "raw")
		se.unchanged(before)
	})
	if c := e.depth("small", nil); c != want {
		t.Fatalf("depth after the rejected payloads = %+v, want %+v", c, want)
	}

	// max_payload_bytes 0 (only settable by update): empty payloads only.
	must[subjects.QueueInfo](e, subjects.OpUpdate, "small", subjects.UpdateQueueRequest{MaxPayloadBytes: ptr(0)})
	e.enqueue("small", subjects.EnqueueRequest{ID: "empty"})
	runErrCases(t, e, nil, []errCase{
		{"zero limit", subjects.OpEnqueue, "small", subjects.EnqueueRequest{ID: "x", Payload: "a"}, subjects.CodePayloadTooLarge},
	})
}

func TestErrMetadata(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("md", subjects.CreateQueueRequest{MaxMetadataPairs: 3})
	pairs := func(n int) map[string]string {
		m := make(map[string]string, n)
		for i := range n {
			m[fmt.Sprintf("k%d", i)] = "v"
		}
		return m
	}
	// At the limits: accepted.
	e.enqueue("md", subjects.EnqueueRequest{ID: "ok-pairs", Metadata: pairs(3)})
	e.enqueue("md", subjects.EnqueueRequest{ID: "ok-key", Metadata: map[string]string{strings.Repeat("k", subjects.MaxMetadataKeyLen): "v"}})
	e.enqueue("md", subjects.EnqueueRequest{ID: "ok-value", Metadata: map[string]string{"k": strings.Repeat("v", subjects.MaxMetadataValueLen)}})
	e.enqueue("md", subjects.EnqueueRequest{ID: "ok-empty-value", Metadata: map[string]string{"k": ""}})
	e.enqueue("md", subjects.EnqueueRequest{ID: "ok-unicode", Metadata: map[string]string{"ключ": "値 ✓"}})
	want := subjects.Counts{Pending: 5}

	bad := func(md map[string]string) subjects.EnqueueRequest {
		return subjects.EnqueueRequest{ID: "x", Metadata: md}
	}
	cases := []errCase{
		{"too many pairs", subjects.OpEnqueue, "md", bad(pairs(4)), subjects.CodeInvalidMetadata},
		{"way too many pairs", subjects.OpEnqueue, "md", bad(pairs(100)), subjects.CodeInvalidMetadata},
		{"key too long", subjects.OpEnqueue, "md", bad(map[string]string{strings.Repeat("k", subjects.MaxMetadataKeyLen+1): "v"}), subjects.CodeInvalidMetadata},
		{"value too long", subjects.OpEnqueue, "md", bad(map[string]string{"k": strings.Repeat("v", subjects.MaxMetadataValueLen+1)}), subjects.CodeInvalidMetadata},
		{"multibyte value too long", subjects.OpEnqueue, "md", bad(map[string]string{"k": strings.Repeat("é", 513)}), subjects.CodeInvalidMetadata},
		{"empty key", subjects.OpEnqueue, "md", bad(map[string]string{"": "v"}), subjects.CodeInvalidMetadata},
		{"control char in key", subjects.OpEnqueue, "md", bad(map[string]string{"a\x01": "v"}), subjects.CodeInvalidMetadata},
		{"NUL in key", subjects.OpEnqueue, "md", bad(map[string]string{"a\x00b": "v"}), subjects.CodeInvalidMetadata},
		{"DEL in key", subjects.OpEnqueue, "md", bad(map[string]string{"a\x7f": "v"}), subjects.CodeInvalidMetadata},
		{"C1 control in key", subjects.OpEnqueue, "md", bad(map[string]string{"a\u0085": "v"}), subjects.CodeInvalidMetadata},
		{"newline in value", subjects.OpEnqueue, "md", bad(map[string]string{"k": "line\nbreak"}), subjects.CodeInvalidMetadata},
		{"tab in value", subjects.OpEnqueue, "md", bad(map[string]string{"k": "a\tb"}), subjects.CodeInvalidMetadata},
		{"batch third invalid", subjects.OpEnqueueBatch, "md", subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{
			{ID: "b1", Metadata: pairs(1)}, {ID: "b2", Metadata: pairs(3)}, {ID: "b3", Metadata: pairs(4)}, {ID: "b4"},
		}}, subjects.CodeInvalidMetadata},
		// Filters are checked against the protocol's limits.
		{"dequeue filter too many pairs", subjects.OpDequeue, "md", subjects.DequeueRequest{Filter: pairs(subjects.MaxMetadataPairs + 1)}, subjects.CodeInvalidMetadata},
		{"dequeue filter key too long", subjects.OpDequeue, "md", subjects.DequeueRequest{Filter: map[string]string{strings.Repeat("k", 129): "v"}}, subjects.CodeInvalidMetadata},
		{"dequeue filter control char", subjects.OpDequeue, "md", subjects.DequeueRequest{Filter: map[string]string{"k": "\x1b[0m"}}, subjects.CodeInvalidMetadata},
		{"depth filter too many pairs", subjects.OpDepth, "md", subjects.DepthRequest{Filter: pairs(subjects.MaxMetadataPairs + 1)}, subjects.CodeInvalidMetadata},
		{"depth filter value too long", subjects.OpDepth, "md", subjects.DepthRequest{Filter: map[string]string{"k": strings.Repeat("v", 1025)}}, subjects.CodeInvalidMetadata},
	}
	runErrCases(t, e, []msgRef{{"md", "ok-pairs"}}, cases)
	if c := e.depth("md", nil); c != want {
		t.Fatalf("depth = %+v, want %+v", c, want)
	}
	// A filter of more pairs than the queue's max_metadata_pairs (but within the protocol's) is fine.
	if ms := e.dequeue("md", subjects.DequeueRequest{Filter: pairs(subjects.MaxMetadataPairs)}); len(ms) != 0 {
		t.Fatalf("dequeue with an unmatched filter leased %v", ids(ms))
	}
}

func TestErrMissingExclusivityKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("ex", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "customer", MaxMetadataPairs: 2})
	e.enqueue("ex", subjects.EnqueueRequest{ID: "ok", Metadata: map[string]string{"customer": "c1"}})
	mk := func(md map[string]string) subjects.EnqueueRequest {
		return subjects.EnqueueRequest{ID: "x", Payload: "p", Metadata: md}
	}
	runErrCases(t, e, []msgRef{{"ex", "ok"}}, []errCase{
		{"no metadata", subjects.OpEnqueue, "ex", mk(nil), subjects.CodeMissingExclusivityKey},
		{"empty body", subjects.OpEnqueue, "ex", nil, subjects.CodeMissingExclusivityKey},
		{"other key", subjects.OpEnqueue, "ex", mk(map[string]string{"tenant": "c1"}), subjects.CodeMissingExclusivityKey},
		{"key case differs", subjects.OpEnqueue, "ex", mk(map[string]string{"Customer": "c1"}), subjects.CodeMissingExclusivityKey},
		{"empty value", subjects.OpEnqueue, "ex", mk(map[string]string{"customer": ""}), subjects.CodeMissingExclusivityKey},
		{"too many pairs wins", subjects.OpEnqueue, "ex", mk(map[string]string{"customer": "c", "a": "1", "b": "2"}), subjects.CodeInvalidMetadata},
		{"batch third missing", subjects.OpEnqueueBatch, "ex", subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{
			{ID: "b1", Metadata: map[string]string{"customer": "c1"}},
			{ID: "b2", Metadata: map[string]string{"customer": "c2"}},
			{ID: "b3", Metadata: map[string]string{"other": "c3"}},
		}}, subjects.CodeMissingExclusivityKey},
	})
	for _, tc := range []struct {
		name string
		hdr  map[string]string
	}{
		{"raw no header", nil},
		{"raw empty value", map[string]string{subjects.HeaderMetadata: `{"customer":""}`}},
		{"raw other key", map[string]string{subjects.HeaderMetadata: `{"tenant":"c1"}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			se := e.on(t)
			before := se.snap()
			se.checkErrReply(se.raw("ex", tc.hdr, []byte("p")), subjects.CodeMissingExclusivityKey, tc.name)
			se.unchanged(before)
		})
	}
	if c := e.depth("ex", nil); c != (subjects.Counts{Pending: 1}) {
		t.Fatalf("depth = %+v, want 1 pending", c)
	}
}

func TestErrInvalidID(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	longest := strings.Repeat("i", subjects.MaxIDLen)
	e.enqueue("q", subjects.EnqueueRequest{ID: longest, Payload: "x"})
	e.enqueue("q", subjects.EnqueueRequest{ID: "m1", Payload: "x"})
	tooLong := strings.Repeat("i", subjects.MaxIDLen+1)
	var cases []errCase
	for _, id := range []string{tooLong, "a\x01b", "a\nb", "\x7f"} {
		cases = append(cases,
			errCase{"enqueue " + strconv.Quote(id[:min(len(id), 8)]), subjects.OpEnqueue, "q", subjects.EnqueueRequest{ID: id, Payload: "x"}, subjects.CodeInvalidID},
			errCase{"batch " + strconv.Quote(id[:min(len(id), 8)]), subjects.OpEnqueueBatch, "q", subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{
				{ID: "b1"}, {ID: "b2"}, {ID: id},
			}}, subjects.CodeInvalidID},
		)
	}
	for _, id := range []string{"", tooLong, "a\x01b"} {
		label := strconv.Quote(id[:min(len(id), 8)])
		cases = append(cases,
			errCase{"complete " + label, subjects.OpComplete, "q", subjects.LeaseRequest{ID: id, LeaseID: "L"}, subjects.CodeInvalidID},
			errCase{"extend " + label, subjects.OpExtend, "q", subjects.ExtendRequest{ID: id, LeaseID: "L"}, subjects.CodeInvalidID},
			errCase{"release " + label, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: id, LeaseID: "L"}, subjects.CodeInvalidID},
			errCase{"cancel " + label, subjects.OpCancel, "q", subjects.LeaseRequest{ID: id}, subjects.CodeInvalidID},
			errCase{"get " + label, subjects.OpGet, "q", subjects.GetRequest{ID: id}, subjects.CodeInvalidID},
		)
	}
	cases = append(cases,
		errCase{"get empty body", subjects.OpGet, "q", nil, subjects.CodeInvalidID},
		errCase{"cancel empty body", subjects.OpCancel, "q", `{}`, subjects.CodeInvalidID},
		errCase{"complete empty body", subjects.OpComplete, "q", nil, subjects.CodeInvalidID},
		// An id given empty is not one to generate: that is omitting it.
		errCase{"enqueue empty id", subjects.OpEnqueue, "q", `{"id":"","payload":"x"}`, subjects.CodeInvalidID},
		errCase{"batch empty id", subjects.OpEnqueueBatch, "q", `{"messages":[{"id":"b1"},{"id":""}]}`, subjects.CodeInvalidID},
	)
	runErrCases(t, e, []msgRef{{"q", "m1"}, {"q", longest}}, cases)
	t.Run("raw", func(t *testing.T) {
		se := e.on(t)
		before := se.snap()
		se.checkErrReply(se.raw("q", map[string]string{subjects.HeaderID: tooLong}, []byte("x")), subjects.CodeInvalidID, "raw")
		se.checkErrReply(se.raw("q", map[string]string{subjects.HeaderID: ""}, []byte("x")), subjects.CodeInvalidID, "raw empty id")
		se.unchanged(before)
	})
	if c := e.depth("q", nil); c != (subjects.Counts{Pending: 2}) {
		t.Fatalf("depth = %+v, want 2 pending", c)
	}
}

func TestErrEnqueueBatchBounds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("b", subjects.CreateQueueRequest{MaxPayloadBytes: 16, MaxMetadataPairs: 2})
	tooMany := make([]subjects.EnqueueRequest, subjects.MaxEnqueueBatch+1)
	third := func(bad subjects.EnqueueRequest) subjects.EnqueueBatchRequest {
		return subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{
			{ID: "a", Payload: "1"}, {ID: "b", Payload: "2"}, bad, {ID: "d", Payload: "4"},
		}}
	}
	runErrCases(t, e, nil, []errCase{
		{"empty list", subjects.OpEnqueueBatch, "b", subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{}}, subjects.CodeOutOfRange},
		{"no messages field", subjects.OpEnqueueBatch, "b", `{}`, subjects.CodeOutOfRange},
		{"empty body", subjects.OpEnqueueBatch, "b", nil, subjects.CodeOutOfRange},
		{"null messages", subjects.OpEnqueueBatch, "b", `{"messages":null}`, subjects.CodeOutOfRange},
		{"1001", subjects.OpEnqueueBatch, "b", subjects.EnqueueBatchRequest{Messages: tooMany}, subjects.CodeOutOfRange},
		{"empty to unknown queue", subjects.OpEnqueueBatch, "fresh", `{"messages":[]}`, subjects.CodeOutOfRange},
		{"third too large", subjects.OpEnqueueBatch, "b", third(subjects.EnqueueRequest{ID: "c", Payload: strings.Repeat("x", 17)}), subjects.CodePayloadTooLarge},
		{"third bad metadata", subjects.OpEnqueueBatch, "b", third(subjects.EnqueueRequest{ID: "c", Metadata: map[string]string{"1": "", "2": "", "3": ""}}), subjects.CodeInvalidMetadata},
		{"third bad id", subjects.OpEnqueueBatch, "b", third(subjects.EnqueueRequest{ID: strings.Repeat("c", 257)}), subjects.CodeInvalidID},
		{"third bad invisible", subjects.OpEnqueueBatch, "b", third(subjects.EnqueueRequest{ID: "c", InvisibleMS: ptr(int64(-1))}), subjects.CodeOutOfRange},
		{"third bad lease", subjects.OpEnqueueBatch, "b", third(subjects.EnqueueRequest{ID: "c", LeaseMS: ptr(int64(99))}), subjects.CodeOutOfRange},
		{"third both payloads", subjects.OpEnqueueBatch, "b", third(subjects.EnqueueRequest{ID: "c", Payload: "x", PayloadBase64: []byte("y")}), subjects.CodeBadRequest},
		{"third bad, no ids", subjects.OpEnqueueBatch, "b", subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{
			{Payload: "1"}, {Payload: "2"}, {Payload: strings.Repeat("x", 17)},
		}}, subjects.CodePayloadTooLarge},
		{"last of many bad", subjects.OpEnqueueBatch, "b", subjects.EnqueueBatchRequest{Messages: append(make([]subjects.EnqueueRequest, 999),
			subjects.EnqueueRequest{InvisibleMS: ptr(maxInvisibleMS + 1)})}, subjects.CodeOutOfRange},
	})
	// The error names the bad message.
	if err := fails(e, subjects.CodeOutOfRange, subjects.OpEnqueueBatch, "b", third(subjects.EnqueueRequest{ID: "c", LeaseMS: ptr(int64(99))})); !strings.HasPrefix(err.Message, "messages[2]: ") {
		t.Errorf("the batch's error %q does not name messages[2]", err.Message)
	}
	if c := e.depth("b", nil); c != (subjects.Counts{}) {
		t.Fatalf("depth = %+v, want zero", c)
	}
	// The bound itself is accepted.
	r := must[subjects.EnqueueBatchReply](e, subjects.OpEnqueueBatch, "b", subjects.EnqueueBatchRequest{Messages: make([]subjects.EnqueueRequest, subjects.MaxEnqueueBatch)})
	if len(r.Messages) != subjects.MaxEnqueueBatch {
		t.Fatalf("batch of %d: %d replies", subjects.MaxEnqueueBatch, len(r.Messages))
	}
	if c := e.depth("b", nil); c != (subjects.Counts{Pending: subjects.MaxEnqueueBatch}) {
		t.Fatalf("depth = %+v", c)
	}
}

func TestErrEnqueueOutOfRange(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	mk := func(inv, lease *int64) subjects.EnqueueRequest {
		return subjects.EnqueueRequest{ID: "x", Payload: "p", InvisibleMS: inv, LeaseMS: lease}
	}
	runErrCases(t, e, nil, []errCase{
		{"invisible -1", subjects.OpEnqueue, "q", mk(ptr(int64(-1)), nil), subjects.CodeOutOfRange},
		{"invisible min int64", subjects.OpEnqueue, "q", mk(ptr(int64(-1<<63)), nil), subjects.CodeOutOfRange},
		{"invisible max+1", subjects.OpEnqueue, "q", mk(ptr(maxInvisibleMS+1), nil), subjects.CodeOutOfRange},
		{"lease 99", subjects.OpEnqueue, "q", mk(nil, ptr(int64(99))), subjects.CodeOutOfRange},
		{"lease -1", subjects.OpEnqueue, "q", mk(nil, ptr(int64(-1))), subjects.CodeOutOfRange},
		{"lease max+1", subjects.OpEnqueue, "q", mk(nil, ptr(maxLeaseMS+1)), subjects.CodeOutOfRange},
		{"max_attempts 0", subjects.OpEnqueue, "q", subjects.EnqueueRequest{ID: "x", MaxAttempts: ptr(int64(0))}, subjects.CodeOutOfRange},
		{"max_attempts max+1", subjects.OpEnqueue, "q", subjects.EnqueueRequest{ID: "x", MaxAttempts: ptr(int64(subjects.MaxAttemptsLimit + 1))}, subjects.CodeOutOfRange},
		{"max_attempts 2^32+1", subjects.OpEnqueue, "q", subjects.EnqueueRequest{ID: "x", MaxAttempts: ptr(int64(1<<32 + 1))}, subjects.CodeOutOfRange},
	})
	if c := e.depth("q", nil); c != (subjects.Counts{}) {
		t.Fatalf("depth = %+v, want zero", c)
	}
	// The bounds are accepted.
	e.enqueue("q", subjects.EnqueueRequest{ID: "a", InvisibleMS: ptr(int64(0)), LeaseMS: ptr(int64(100))})
	e.enqueue("q", subjects.EnqueueRequest{ID: "b", InvisibleMS: ptr(maxInvisibleMS), LeaseMS: ptr(maxLeaseMS)})
	if c := e.depth("q", nil); c != (subjects.Counts{Pending: 1, Invisible: 1}) {
		t.Fatalf("depth = %+v", c)
	}
	// max_attempts is the message's own, at the bounds too.
	for id, n := range map[string]int64{"one": 1, "most": subjects.MaxAttemptsLimit} {
		r := e.enqueue("q", subjects.EnqueueRequest{ID: id, MaxAttempts: ptr(n), InvisibleMS: ptr(maxInvisibleMS)})
		if m := e.get("q", r.ID); int64(m.AttemptsLeft) != n {
			t.Fatalf("%s enqueued with max_attempts %d: %d attempts left", id, n, m.AttemptsLeft)
		}
	}
	// lease_ms 0 is the queue's, as on dequeue and extend.
	e.enqueue("q", subjects.EnqueueRequest{ID: "c", LeaseMS: ptr(int64(0)), Priority: ptr(int64(-1))})
	if m := e.dequeueOne("q"); m.ID != "c" || m.LeaseExpiresAt.Sub(m.UpdatedAt) != subjects.DefaultLease {
		t.Fatalf("dequeued %+v, want c with the queue's lease", m)
	}
}

func TestErrDequeueOutOfRange(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("d", subjects.CreateQueueRequest{})
	for i := range 5 {
		e.enqueue("d", subjects.EnqueueRequest{ID: fmt.Sprintf("m%d", i), Priority: ptr(int64(i))})
	}
	watch := []msgRef{{"d", "m0"}, {"d", "m4"}}
	deq := func(r subjects.DequeueRequest) errCase {
		return errCase{op: subjects.OpDequeue, queue: "d", body: r, code: subjects.CodeOutOfRange}
	}
	cases := []errCase{
		deq(subjects.DequeueRequest{Batch: -1}),
		deq(subjects.DequeueRequest{Batch: subjects.MaxDequeueBatch + 1}),
		deq(subjects.DequeueRequest{Batch: 1 << 40}),
		deq(subjects.DequeueRequest{LeaseMS: 99}),
		deq(subjects.DequeueRequest{LeaseMS: -1}),
		deq(subjects.DequeueRequest{LeaseMS: maxLeaseMS + 1}),
		deq(subjects.DequeueRequest{WaitMS: -1}),
		deq(subjects.DequeueRequest{WaitMS: maxWaitMS + 1}),
		deq(subjects.DequeueRequest{Batch: 2, LeaseMS: 1000, WaitMS: maxWaitMS + 1}),
		{op: subjects.OpDequeue, queue: "d", body: subjects.DequeueRequest{RequestID: strings.Repeat("r", subjects.MaxRequestIDLen+1)}, code: subjects.CodeBadRequest},
		{op: subjects.OpDequeue, queue: "d", body: subjects.DequeueRequest{RequestID: "r\x01"}, code: subjects.CodeBadRequest},
	}
	for i := range cases {
		cases[i].name = fmt.Sprintf("%d %v", i, cases[i].body)
	}
	runErrCases(t, e, watch, cases)
	if c := e.depth("d", nil); c != (subjects.Counts{Pending: 5}) {
		t.Fatalf("depth = %+v, want 5 pending", c)
	}

	// batch 0 is the default, 1.
	if ms := e.dequeue("d", subjects.DequeueRequest{Batch: 0}); len(ms) != 1 || ms[0].ID != "m0" {
		t.Fatalf("dequeue with batch 0: %v", ids(ms))
	}
	// The bounds are accepted.
	ms := e.dequeue("d", subjects.DequeueRequest{Batch: 1, LeaseMS: 100, WaitMS: maxWaitMS, RequestID: strings.Repeat("r", subjects.MaxRequestIDLen)})
	if len(ms) != 1 || ms[0].ID != "m1" {
		t.Fatalf("dequeue at the lower lease bound: %v", ids(ms))
	}
	ms = e.dequeue("d", subjects.DequeueRequest{Batch: subjects.MaxDequeueBatch, LeaseMS: maxLeaseMS})
	if len(ms) != 3 {
		t.Fatalf("dequeue of batch %d: %v", subjects.MaxDequeueBatch, ids(ms))
	}
}

// TestErrLeaseOpsOutOfRange: extend's lease_ms and release's delay_ms out of bounds change nothing.
func TestErrLeaseOpsOutOfRange(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.enqueue("q", subjects.EnqueueRequest{ID: "r", Payload: "x"})
	lease := e.dequeueOne("q").LeaseID
	runErrCases(t, e, []msgRef{{"q", "r"}}, []errCase{
		{"extend 99", subjects.OpExtend, "q", subjects.ExtendRequest{ID: "r", LeaseID: lease, LeaseMS: 99}, subjects.CodeOutOfRange},
		{"extend -1", subjects.OpExtend, "q", subjects.ExtendRequest{ID: "r", LeaseID: lease, LeaseMS: -1}, subjects.CodeOutOfRange},
		{"extend max+1", subjects.OpExtend, "q", subjects.ExtendRequest{ID: "r", LeaseID: lease, LeaseMS: maxLeaseMS + 1}, subjects.CodeOutOfRange},
		{"release -1", subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "r", LeaseID: lease, DelayMS: -1}, subjects.CodeOutOfRange},
		{"release max+1", subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "r", LeaseID: lease, DelayMS: maxInvisibleMS + 1}, subjects.CodeOutOfRange},
	})
	m := e.get("q", "r")
	if m.State != subjects.StateRunning || m.LeaseID != lease || m.Version != 2 {
		t.Fatalf("after the rejected requests: %+v", m)
	}
	// The bounds are accepted.
	for _, ms := range []int64{100, maxLeaseMS} {
		if m := must[subjects.Message](e, subjects.OpExtend, "q", subjects.ExtendRequest{ID: "r", LeaseID: lease, LeaseMS: ms}); m.State != subjects.StateRunning {
			t.Fatalf("extend %d: %+v", ms, m)
		}
	}
	if m := must[subjects.Message](e, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "r", LeaseID: lease, DelayMS: maxInvisibleMS}); m.State != subjects.StateInvisible {
		t.Fatalf("release with the longest delay: %+v", m)
	}
}

func TestErrCreateInvalidConfig(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("existing", subjects.CreateQueueRequest{})
	cr := func(r subjects.CreateQueueRequest) errCase {
		return errCase{op: subjects.OpCreate, queue: "c", body: r, code: subjects.CodeInvalidConfig}
	}
	cases := []errCase{
		cr(subjects.CreateQueueRequest{Type: "fifo"}),
		cr(subjects.CreateQueueRequest{Type: "Simple"}),
		cr(subjects.CreateQueueRequest{Type: subjects.Exclusive}),
		cr(subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: strings.Repeat("k", subjects.MaxMetadataKeyLen+1)}),
		cr(subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "cust\x01omer"}),
		cr(subjects.CreateQueueRequest{ExclusivityKey: "customer"}),
		cr(subjects.CreateQueueRequest{Type: subjects.Simple, ExclusivityKey: "customer"}),
		cr(subjects.CreateQueueRequest{LeaseMS: 99}),
		cr(subjects.CreateQueueRequest{LeaseMS: -1}),
		cr(subjects.CreateQueueRequest{LeaseMS: maxLeaseMS + 1}),
		cr(subjects.CreateQueueRequest{InvisibleMS: -1}),
		cr(subjects.CreateQueueRequest{InvisibleMS: maxInvisibleMS + 1}),
		cr(subjects.CreateQueueRequest{MaxAttempts: -1}),
		cr(subjects.CreateQueueRequest{MaxAttempts: subjects.MaxAttemptsLimit + 1}),
		cr(subjects.CreateQueueRequest{RetentionMS: ptr(int64(-1))}),
		cr(subjects.CreateQueueRequest{RetentionMS: ptr(maxRetentionMS + 1)}),
		cr(subjects.CreateQueueRequest{MaxPayloadBytes: -1}),
		cr(subjects.CreateQueueRequest{MaxPayloadBytes: subjects.MaxPayloadBytes + 1}),
		cr(subjects.CreateQueueRequest{MaxMetadataPairs: -1}),
		cr(subjects.CreateQueueRequest{MaxMetadataPairs: subjects.MaxMetadataPairs + 1}),
		cr(subjects.CreateQueueRequest{MaxRunning: -1}),
		cr(subjects.CreateQueueRequest{MaxRunning: subjects.MaxRunningLimit + 1}),
		// An invalid config for an existing queue is invalid_config, not queue_exists.
		{op: subjects.OpCreate, queue: "existing", body: subjects.CreateQueueRequest{LeaseMS: 99}, code: subjects.CodeInvalidConfig},
	}
	for i := range cases {
		b, _ := json.Marshal(cases[i].body)
		cases[i].name = fmt.Sprintf("%d %s", i, b)
	}
	runErrCases(t, e, nil, cases)

	// The bounds are accepted.
	for i, r := range []subjects.CreateQueueRequest{
		{LeaseMS: 100, InvisibleMS: 0, MaxAttempts: 1, RetentionMS: ptr(int64(0)), MaxPayloadBytes: 1, MaxMetadataPairs: 1, MaxRunning: 1},
		{LeaseMS: maxLeaseMS, InvisibleMS: maxInvisibleMS, MaxAttempts: subjects.MaxAttemptsLimit, RetentionMS: ptr(maxRetentionMS),
			MaxPayloadBytes: subjects.MaxPayloadBytes, MaxMetadataPairs: subjects.MaxMetadataPairs, MaxRunning: subjects.MaxRunningLimit},
		{Type: subjects.Exclusive, ExclusivityKey: strings.Repeat("k", subjects.MaxMetadataKeyLen)},
	} {
		e.create(fmt.Sprintf("bound%d", i), r)
	}
}

func TestErrCreateQueueExists(t *testing.T) {
	t.Parallel()
	e := setup(t)
	first := e.create("c", subjects.CreateQueueRequest{})
	e.create("ex", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "k"})
	e.enqueue("auto", subjects.EnqueueRequest{ID: "m1"}) // auto-created with the defaults
	cr := func(q string, r subjects.CreateQueueRequest) errCase {
		return errCase{op: subjects.OpCreate, queue: q, body: r, code: subjects.CodeQueueExists}
	}
	cases := []errCase{
		cr("c", subjects.CreateQueueRequest{LeaseMS: 60_000}),
		cr("c", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "k"}),
		cr("c", subjects.CreateQueueRequest{EnqueueBlocked: true}),
		cr("c", subjects.CreateQueueRequest{RetentionMS: ptr(int64(0))}),
		cr("ex", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "other"}),
		cr("ex", subjects.CreateQueueRequest{}),
		cr("auto", subjects.CreateQueueRequest{MaxAttempts: 1}),
	}
	for i := range cases {
		b, _ := json.Marshal(cases[i].body)
		cases[i].name = fmt.Sprintf("%s %s", cases[i].queue, b)
	}
	runErrCases(t, e, []msgRef{{"auto", "m1"}}, cases)

	// The same config again (given or by its defaults) is a success with the same revision.
	for _, r := range []subjects.CreateQueueRequest{
		{},
		{Type: subjects.Simple, LeaseMS: 30_000, MaxAttempts: 5, RetentionMS: ptr(int64(86_400_000)), MaxPayloadBytes: 32 << 10, MaxMetadataPairs: 8},
	} {
		again := e.create("c", r)
		if again.Revision != first.Revision || again.Config != first.Config || !again.CreatedAt.Equal(first.CreatedAt) {
			t.Fatalf("create again with %+v = %+v, want %+v", r, again, first)
		}
	}
	// After an update the stored config differs from the defaults.
	must[subjects.QueueInfo](e, subjects.OpUpdate, "c", subjects.UpdateQueueRequest{LeaseMS: ptr(int64(1000))})
	runErrCases(t, e, nil, []errCase{cr("c", subjects.CreateQueueRequest{})})
	// The refusal names what differs, the queue's setting first.
	err := fails(e, subjects.CodeQueueExists, subjects.OpCreate, "c", subjects.CreateQueueRequest{MaxAttempts: 3})
	if want := "(lease_ms 1000, not 30000; max_attempts 5, not 3): update it"; !strings.Contains(err.Message, want) {
		t.Fatalf("the refusal %q does not say %q", err.Message, want)
	}
	// A type or key that differs cannot be updated: the refusal says what can be done instead, and
	// names the settings the request gave, not the default the other type implies.
	err = fails(e, subjects.CodeQueueExists, subjects.OpCreate, "auto", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "k"})
	if want := `(type "simple", not "exclusive"; exclusivity_key "", not "k"): a queue's type and exclusivity key do not change: create it under another name, or delete it`; !strings.Contains(err.Message, want) {
		t.Fatalf("the refusal %q does not say %q", err.Message, want)
	}
	err = fails(e, subjects.CodeQueueExists, subjects.OpCreate, "ex", subjects.CreateQueueRequest{Type: subjects.Exclusive, ExclusivityKey: "other", MaxRunningPerValue: 2})
	if want := `(exclusivity_key "k", not "other"; max_running_per_value 1, not 2): a queue's type`; !strings.Contains(err.Message, want) {
		t.Fatalf("the refusal %q does not say %q", err.Message, want)
	}
}

// TestCreateOfABlockedQueue: the blocked flags are an operator's switches. A create that does not
// set them returns the queue as it is, blocked or not, and writes nothing; one that sets a flag
// the queue does not have is queue_exists.
func TestCreateOfABlockedQueue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("p", subjects.CreateQueueRequest{LeaseMS: 60_000})
	blocked := must[subjects.QueueInfo](e, subjects.OpUpdate, "p", subjects.UpdateQueueRequest{DequeueBlocked: ptr(true)})
	for _, r := range []subjects.CreateQueueRequest{{LeaseMS: 60_000}, {LeaseMS: 60_000, DequeueBlocked: true}} {
		again := e.create("p", r)
		if again.Revision != blocked.Revision || again.Config != blocked.Config || !again.Config.DequeueBlocked {
			t.Fatalf("create of the paused queue with %+v = %+v, want %+v", r, again, blocked)
		}
	}
	runErrCases(t, e, nil, []errCase{
		{op: subjects.OpCreate, queue: "p", body: subjects.CreateQueueRequest{LeaseMS: 60_000, EnqueueBlocked: true}, code: subjects.CodeQueueExists, name: "enqueue_blocked not set"},
		{op: subjects.OpCreate, queue: "p", body: subjects.CreateQueueRequest{}, code: subjects.CodeQueueExists, name: "another lease"},
	})
}

func TestErrUpdate(t *testing.T) {
	t.Parallel()
	e := setup(t)
	info := e.create("u", subjects.CreateQueueRequest{})
	up := func(r subjects.UpdateQueueRequest) errCase {
		return errCase{op: subjects.OpUpdate, queue: "u", body: r, code: subjects.CodeInvalidConfig}
	}
	cases := []errCase{
		up(subjects.UpdateQueueRequest{LeaseMS: ptr(int64(99))}),
		up(subjects.UpdateQueueRequest{LeaseMS: ptr(int64(0))}),
		up(subjects.UpdateQueueRequest{LeaseMS: ptr(maxLeaseMS + 1)}),
		up(subjects.UpdateQueueRequest{InvisibleMS: ptr(int64(-1))}),
		up(subjects.UpdateQueueRequest{InvisibleMS: ptr(maxInvisibleMS + 1)}),
		up(subjects.UpdateQueueRequest{MaxAttempts: ptr(0)}),
		up(subjects.UpdateQueueRequest{MaxAttempts: ptr(subjects.MaxAttemptsLimit + 1)}),
		up(subjects.UpdateQueueRequest{RetentionMS: ptr(int64(-1))}),
		up(subjects.UpdateQueueRequest{RetentionMS: ptr(maxRetentionMS + 1)}),
		up(subjects.UpdateQueueRequest{MaxPayloadBytes: ptr(-1)}),
		up(subjects.UpdateQueueRequest{MaxPayloadBytes: ptr(subjects.MaxPayloadBytes + 1)}),
		up(subjects.UpdateQueueRequest{MaxMetadataPairs: ptr(0)}),
		up(subjects.UpdateQueueRequest{MaxMetadataPairs: ptr(subjects.MaxMetadataPairs + 1)}),
		up(subjects.UpdateQueueRequest{MaxRunning: ptr(-1)}),
		up(subjects.UpdateQueueRequest{MaxRunning: ptr(subjects.MaxRunningLimit + 1)}),
		// One bad field among good ones changes nothing.
		up(subjects.UpdateQueueRequest{LeaseMS: ptr(int64(5000)), EnqueueBlocked: ptr(true), MaxAttempts: ptr(-3)}),
		up(subjects.UpdateQueueRequest{Revision: info.Revision, LeaseMS: ptr(int64(5000)), MaxMetadataPairs: ptr(33)}),
		{op: subjects.OpUpdate, queue: "u", body: subjects.UpdateQueueRequest{Revision: info.Revision + 1, LeaseMS: ptr(int64(5000))}, code: subjects.CodeRevisionMismatch},
		{op: subjects.OpUpdate, queue: "u", body: subjects.UpdateQueueRequest{Revision: info.Revision + 1000}, code: subjects.CodeRevisionMismatch},
		{op: subjects.OpUpdate, queue: "u", body: `{"type":"exclusive"}`, code: subjects.CodeBadRequest},
		{op: subjects.OpUpdate, queue: "u", body: `{"exclusivity_key":"k"}`, code: subjects.CodeBadRequest},
		{op: subjects.OpUpdate, queue: "u", body: `{"lease_ms":5000,"name":"v"}`, code: subjects.CodeBadRequest},
		{op: subjects.OpUpdate, queue: "ghost", body: subjects.UpdateQueueRequest{LeaseMS: ptr(int64(5000))}, code: subjects.CodeQueueNotFound},
	}
	for i := range cases {
		b, _ := json.Marshal(cases[i].body)
		cases[i].name = fmt.Sprintf("%d %s", i, b)
	}
	runErrCases(t, e, nil, cases)
	now := must[subjects.QueueInfo](e, subjects.OpInfo, "u", nil)
	if now.Revision != info.Revision || now.Config != info.Config {
		t.Fatalf("info after the rejected updates = %+v, want %+v", now, info)
	}

	// A good update moves the revision; the old one is then stale.
	next := must[subjects.QueueInfo](e, subjects.OpUpdate, "u", subjects.UpdateQueueRequest{Revision: info.Revision, LeaseMS: ptr(int64(5000))})
	if next.Revision == info.Revision || next.Config.LeaseMS != 5000 {
		t.Fatalf("update: %+v", next)
	}
	runErrCases(t, e, nil, []errCase{
		{"stale revision", subjects.OpUpdate, "u", subjects.UpdateQueueRequest{Revision: info.Revision, LeaseMS: ptr(int64(6000))}, subjects.CodeRevisionMismatch},
		{"stale revision no change", subjects.OpUpdate, "u", subjects.UpdateQueueRequest{Revision: info.Revision}, subjects.CodeRevisionMismatch},
	})
	// The same update sent again (its reply lost) finds its fields set: it succeeds, writing nothing.
	again := must[subjects.QueueInfo](e, subjects.OpUpdate, "u", subjects.UpdateQueueRequest{Revision: info.Revision, LeaseMS: ptr(int64(5000))})
	if again.Revision != next.Revision || again.Config != next.Config {
		t.Fatalf("the update's retry: %+v, want %+v unchanged", again, next)
	}
}

func TestErrQueueBlocked(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("eb", subjects.CreateQueueRequest{EnqueueBlocked: true})
	e.create("db", subjects.CreateQueueRequest{DequeueBlocked: true})
	e.enqueue("db", subjects.EnqueueRequest{ID: "m1", Payload: "x"})
	e.create("later", subjects.CreateQueueRequest{})
	e.enqueue("later", subjects.EnqueueRequest{ID: "m1", Payload: "x"})
	must[subjects.QueueInfo](e, subjects.OpUpdate, "later", subjects.UpdateQueueRequest{EnqueueBlocked: ptr(true), DequeueBlocked: ptr(true)})
	watch := []msgRef{{"db", "m1"}, {"later", "m1"}}
	cases := []errCase{
		{"enqueue", subjects.OpEnqueue, "eb", subjects.EnqueueRequest{ID: "x", Payload: "x"}, subjects.CodeQueueBlocked},
		{"enqueue batch", subjects.OpEnqueueBatch, "eb", subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{{ID: "x"}, {ID: "y"}}}, subjects.CodeQueueBlocked},
		{"enqueue duplicate id", subjects.OpEnqueue, "later", subjects.EnqueueRequest{ID: "m1", Payload: "x"}, subjects.CodeQueueBlocked},
		{"dequeue", subjects.OpDequeue, "db", subjects.DequeueRequest{}, subjects.CodeQueueBlocked},
		{"dequeue batch", subjects.OpDequeue, "db", subjects.DequeueRequest{Batch: 10}, subjects.CodeQueueBlocked},
		{"dequeue wait", subjects.OpDequeue, "db", subjects.DequeueRequest{WaitMS: 1000}, subjects.CodeQueueBlocked},
		{"enqueue blocked by update", subjects.OpEnqueue, "later", subjects.EnqueueRequest{ID: "x"}, subjects.CodeQueueBlocked},
		{"dequeue blocked by update", subjects.OpDequeue, "later", subjects.DequeueRequest{}, subjects.CodeQueueBlocked},
		// A bad request is bad, blocked or not: queue_blocked would have it retried.
		{"bad enqueue", subjects.OpEnqueue, "eb", subjects.EnqueueRequest{ID: "x", LeaseMS: ptr[int64](1)}, subjects.CodeOutOfRange},
		{"bad enqueue batch", subjects.OpEnqueueBatch, "eb", subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{{ID: "x"}, {ID: "y\x01"}}}, subjects.CodeInvalidID},
	}
	runErrCases(t, e, watch, cases)
	t.Run("enqueue raw", func(t *testing.T) {
		se := e.on(t)
		before := se.snap(watch...)
		se.checkErrReply(se.raw("eb", nil, []byte("x")), subjects.CodeQueueBlocked, "raw")
		se.unchanged(before)
	})
	if c := e.depth("eb", nil); c != (subjects.Counts{}) {
		t.Fatalf("eb depth = %+v", c)
	}
	if c := e.depth("db", nil); c != (subjects.Counts{Pending: 1}) {
		t.Fatalf("db depth = %+v", c)
	}

	// Unblocking makes them work again.
	must[subjects.QueueInfo](e, subjects.OpUpdate, "eb", subjects.UpdateQueueRequest{EnqueueBlocked: ptr(false)})
	e.enqueue("eb", subjects.EnqueueRequest{ID: "x"})
	e.rawOK("eb", nil, []byte("y"))
	must[subjects.QueueInfo](e, subjects.OpUpdate, "db", subjects.UpdateQueueRequest{DequeueBlocked: ptr(false)})
	if m := e.dequeueOne("db"); m.ID != "m1" {
		t.Fatalf("dequeue after unblocking: %+v", m)
	}
	must[subjects.QueueInfo](e, subjects.OpUpdate, "later", subjects.UpdateQueueRequest{EnqueueBlocked: ptr(false), DequeueBlocked: ptr(false)})
	e.enqueue("later", subjects.EnqueueRequest{ID: "m2"})
	if m := e.dequeueOne("later"); m.ID != "m1" {
		t.Fatalf("dequeue after unblocking: %+v", m)
	}
}

// TestErrQueueNotFound: every operation on an existing queue's name fails on an unknown one, and no
// queue is created by it.
func TestErrQueueNotFound(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("real", subjects.CreateQueueRequest{})
	e.enqueue("real", subjects.EnqueueRequest{ID: "m1", Payload: "x"})
	e.create("gone", subjects.CreateQueueRequest{})
	e.enqueue("gone", subjects.EnqueueRequest{ID: "g1", Payload: "x"})
	must[subjects.DeleteReply](e, subjects.OpDelete, "gone", nil)
	var cases []errCase
	for _, q := range []string{"ghost", "gone", "Real", "real_"} {
		cases = append(cases, notFoundCases(q)...)
	}
	runErrCases(t, e, []msgRef{{"real", "m1"}}, cases)
	if qs := must[subjects.ListReply](e, subjects.OpList, "", nil).Queues; len(qs) != 1 || qs[0].Name != "real" {
		t.Fatalf("queues = %+v", qs)
	}
	// A new queue of a deleted one's name does not have its messages.
	e.create("gone", subjects.CreateQueueRequest{})
	runErrCases(t, e, nil, []errCase{{"old message", subjects.OpGet, "gone", subjects.GetRequest{ID: "g1"}, subjects.CodeMessageNotFound}})
}

// TestErrQueueNotFoundNoAutoCreate: with auto-create off, the enqueues to an unknown queue fail too.
func TestErrQueueNotFoundNoAutoCreate(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *broker.Config) { c.DisableAutoCreate = true })
	e.create("real", subjects.CreateQueueRequest{})
	cases := notFoundCases("ghost")
	cases = append(cases,
		errCase{"enqueue", subjects.OpEnqueue, "ghost", subjects.EnqueueRequest{ID: "x", Payload: "x"}, subjects.CodeQueueNotFound},
		errCase{"enqueue empty", subjects.OpEnqueue, "ghost", nil, subjects.CodeQueueNotFound},
		errCase{"enqueue batch", subjects.OpEnqueueBatch, "ghost", subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{{ID: "x"}, {ID: "y"}}}, subjects.CodeQueueNotFound},
	)
	runErrCases(t, e, nil, cases)
	t.Run("enqueue raw", func(t *testing.T) {
		se := e.on(t)
		before := se.snap()
		se.checkErrReply(se.raw("ghost", map[string]string{subjects.HeaderID: "x"}, []byte("x")), subjects.CodeQueueNotFound, "raw")
		se.unchanged(before)
	})
	if qs := must[subjects.ListReply](e, subjects.OpList, "", nil).Queues; len(qs) != 1 || qs[0].Name != "real" {
		t.Fatalf("queues = %+v", qs)
	}
	// Explicit creation still works, and then enqueue does.
	e.create("ghost", subjects.CreateQueueRequest{})
	e.enqueue("ghost", subjects.EnqueueRequest{ID: "x"})
}

// TestErrAutoCreateInvalidEnqueue: an invalid enqueue to an unknown queue (auto-create on) must not
// leave a new queue behind: a bad request writes nothing.
func TestErrAutoCreateInvalidEnqueue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("real", subjects.CreateQueueRequest{})
	md := make(map[string]string)
	for i := range subjects.DefaultMaxMetadataPairs + 1 {
		md[strconv.Itoa(i)] = "v"
	}
	runErrCases(t, e, nil, []errCase{
		{"too many metadata pairs", subjects.OpEnqueue, "fresh1", subjects.EnqueueRequest{Metadata: md}, subjects.CodeInvalidMetadata},
		{"both payload forms", subjects.OpEnqueue, "fresh8", `{"payload":"a","payload_base64":"YQ=="}`, subjects.CodeBadRequest},
		{"bad metadata key", subjects.OpEnqueue, "fresh2", subjects.EnqueueRequest{Metadata: map[string]string{"": "v"}}, subjects.CodeInvalidMetadata},
		{"id too long", subjects.OpEnqueue, "fresh3", subjects.EnqueueRequest{ID: strings.Repeat("i", 257)}, subjects.CodeInvalidID},
		{"invisible -1", subjects.OpEnqueue, "fresh4", subjects.EnqueueRequest{InvisibleMS: ptr(int64(-1))}, subjects.CodeOutOfRange},
		{"payload too large", subjects.OpEnqueue, "fresh5", subjects.EnqueueRequest{Payload: strings.Repeat("x", subjects.DefaultMaxPayloadBytes+1)}, subjects.CodePayloadTooLarge},
		{"batch third invalid", subjects.OpEnqueueBatch, "fresh6", subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{
			{ID: "a"}, {ID: "b"}, {ID: "c", LeaseMS: ptr(int64(99))},
		}}, subjects.CodeOutOfRange},
	})
	t.Run("raw lease 99", func(t *testing.T) {
		se := e.on(t)
		before := se.snap()
		se.checkErrReply(se.raw("fresh7", map[string]string{subjects.HeaderLeaseMS: "99"}, []byte("x")), subjects.CodeOutOfRange, "raw")
		se.unchanged(before)
	})
}

func TestErrMessageNotFound(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.enqueue("q", subjects.EnqueueRequest{ID: "m1", Payload: "x"})
	e.enqueue("other", subjects.EnqueueRequest{ID: "o1", Payload: "x"})
	var cases []errCase
	for _, id := range []string{"nope", "M1", "m1 ", "o1"} {
		cases = append(cases,
			errCase{"complete " + id, subjects.OpComplete, "q", subjects.LeaseRequest{ID: id, LeaseID: "L"}, subjects.CodeMessageNotFound},
			errCase{"extend " + id, subjects.OpExtend, "q", subjects.ExtendRequest{ID: id, LeaseID: "L"}, subjects.CodeMessageNotFound},
			errCase{"release " + id, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: id, LeaseID: "L"}, subjects.CodeMessageNotFound},
			errCase{"cancel " + id, subjects.OpCancel, "q", subjects.LeaseRequest{ID: id}, subjects.CodeMessageNotFound},
			errCase{"cancel with lease " + id, subjects.OpCancel, "q", subjects.LeaseRequest{ID: id, LeaseID: "L"}, subjects.CodeMessageNotFound},
			errCase{"get " + id, subjects.OpGet, "q", subjects.GetRequest{ID: id}, subjects.CodeMessageNotFound},
		)
	}
	runErrCases(t, e, []msgRef{{"q", "m1"}, {"other", "o1"}}, cases)

	// A collected message is not found either.
	lease := e.dequeueOne("q").LeaseID
	must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m1", LeaseID: lease})
	e.advance(subjects.DefaultRetention)
	// The collection's marker expires on the server's clock (a second): wait, so that it does not go
	// between a case's two readings of the stream, which must find it unchanged.
	e.waitStreamMsgs("KV_natstone-messages", 1)
	runErrCases(t, e, nil, []errCase{
		{"get collected", subjects.OpGet, "q", subjects.GetRequest{ID: "m1"}, subjects.CodeMessageNotFound},
		{"complete collected", subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m1", LeaseID: lease}, subjects.CodeMessageNotFound},
		{"cancel collected", subjects.OpCancel, "q", subjects.LeaseRequest{ID: "m1"}, subjects.CodeMessageNotFound},
	})
}

// TestErrLease covers a missing, wrong, expired and superseded lease id.
func TestErrLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.enqueue("q", subjects.EnqueueRequest{ID: "m", Payload: "x"})
	old := e.dequeueOne("q")
	if old.Version != 2 {
		t.Fatalf("dequeue: %+v", old)
	}
	ref := []msgRef{{"q", "m"}}
	runErrCases(t, e, ref, []errCase{
		{"complete no lease", subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m"}, subjects.CodeBadRequest},
		{"extend no lease", subjects.OpExtend, "q", subjects.ExtendRequest{ID: "m"}, subjects.CodeBadRequest},
		{"release no lease", subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "m"}, subjects.CodeBadRequest},
		{"complete wrong lease", subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m", LeaseID: "wrong"}, subjects.CodeLeaseMismatch},
		{"complete lease of other case", subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m", LeaseID: strings.ToLower(old.LeaseID)}, subjects.CodeLeaseMismatch},
		{"extend wrong lease", subjects.OpExtend, "q", subjects.ExtendRequest{ID: "m", LeaseID: "wrong"}, subjects.CodeLeaseMismatch},
		{"release wrong lease", subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "m", LeaseID: "wrong"}, subjects.CodeLeaseMismatch},
		{"cancel wrong lease", subjects.OpCancel, "q", subjects.LeaseRequest{ID: "m", LeaseID: "wrong"}, subjects.CodeLeaseMismatch},
	})

	// Just before the lease ends it is still held.
	e.advance(subjects.DefaultLease - time.Millisecond)
	if m := e.get("q", "m"); m.State != subjects.StateRunning || m.Version != 2 {
		t.Fatalf("1ms before expiry: %+v", m)
	}
	e.advance(time.Millisecond)
	expired := e.get("q", "m")
	if expired.State != subjects.StatePending || expired.Version != 3 {
		t.Fatalf("after expiry: %+v", expired)
	}
	runErrCases(t, e, ref, []errCase{
		{"complete expired", subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m", LeaseID: old.LeaseID}, subjects.CodeLeaseExpired},
		{"extend expired", subjects.OpExtend, "q", subjects.ExtendRequest{ID: "m", LeaseID: old.LeaseID}, subjects.CodeLeaseExpired},
		{"extend expired with lease_ms", subjects.OpExtend, "q", subjects.ExtendRequest{ID: "m", LeaseID: old.LeaseID, LeaseMS: 60_000}, subjects.CodeLeaseExpired},
		{"release expired", subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "m", LeaseID: old.LeaseID}, subjects.CodeLeaseExpired},
		{"release expired with delay", subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "m", LeaseID: old.LeaseID, DelayMS: 1000}, subjects.CodeLeaseExpired},
		{"complete wrong lease after expiry", subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m", LeaseID: "wrong"}, subjects.CodeLeaseMismatch},
	})

	// A newer dequeue leased it again: the old lease no longer matches.
	again := e.dequeueOne("q")
	if again.ID != "m" || again.LeaseID == old.LeaseID || again.Version != 4 {
		t.Fatalf("second dequeue: %+v", again)
	}
	runErrCases(t, e, ref, []errCase{
		{"complete superseded", subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m", LeaseID: old.LeaseID}, subjects.CodeLeaseMismatch},
		{"extend superseded", subjects.OpExtend, "q", subjects.ExtendRequest{ID: "m", LeaseID: old.LeaseID}, subjects.CodeLeaseMismatch},
		{"release superseded", subjects.OpRelease, "q", subjects.ReleaseRequest{ID: "m", LeaseID: old.LeaseID}, subjects.CodeLeaseMismatch},
		{"cancel superseded", subjects.OpCancel, "q", subjects.LeaseRequest{ID: "m", LeaseID: old.LeaseID}, subjects.CodeLeaseMismatch},
	})
	if m := must[subjects.Message](e, subjects.OpComplete, "q", subjects.LeaseRequest{ID: "m", LeaseID: again.LeaseID}); m.State != subjects.StateCompleted || m.Version != 5 {
		t.Fatalf("complete with the current lease: %+v", m)
	}

	// A per-request lease expires on its own schedule; with no attempts left the message is errored,
	// and its lease is still expired.
	e.create("one", subjects.CreateQueueRequest{MaxAttempts: 1})
	e.enqueue("one", subjects.EnqueueRequest{ID: "x"})
	ms := e.dequeue("one", subjects.DequeueRequest{LeaseMS: 1000})
	if len(ms) != 1 {
		t.Fatalf("dequeue: %v", ids(ms))
	}
	e.advance(time.Second)
	if m := e.get("one", "x"); m.State != subjects.StateErrored || m.Version != 3 {
		t.Fatalf("after expiry with no attempts left: %+v", m)
	}
	runErrCases(t, e, []msgRef{{"one", "x"}}, []errCase{
		{"complete errored by expiry", subjects.OpComplete, "one", subjects.LeaseRequest{ID: "x", LeaseID: ms[0].LeaseID}, subjects.CodeLeaseExpired},
		{"extend errored by expiry", subjects.OpExtend, "one", subjects.ExtendRequest{ID: "x", LeaseID: ms[0].LeaseID}, subjects.CodeLeaseExpired},
		{"release errored by expiry", subjects.OpRelease, "one", subjects.ReleaseRequest{ID: "x", LeaseID: ms[0].LeaseID}, subjects.CodeLeaseExpired},
		{"cancel errored", subjects.OpCancel, "one", subjects.LeaseRequest{ID: "x"}, subjects.CodeInvalidState},
	})
}

// TestErrWrongStatePending: complete/extend/release of a message that was never leased. It has no
// lease, so any lease id is not its lease: lease_mismatch (invalid_state would also be defensible;
// the test pins what the engine does).
func TestErrWrongStatePending(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	e.enqueue("q", subjects.EnqueueRequest{ID: "p", Payload: "x"})
	e.enqueue("q", subjects.EnqueueRequest{ID: "inv", Payload: "x", InvisibleMS: ptr(int64(60_000))})
	ref := []msgRef{{"q", "p"}, {"q", "inv"}}
	var cases []errCase
	for _, id := range []string{"p", "inv"} {
		cases = append(cases,
			errCase{"complete " + id, subjects.OpComplete, "q", subjects.LeaseRequest{ID: id, LeaseID: "any"}, subjects.CodeLeaseMismatch},
			errCase{"extend " + id, subjects.OpExtend, "q", subjects.ExtendRequest{ID: id, LeaseID: "any"}, subjects.CodeLeaseMismatch},
			errCase{"release " + id, subjects.OpRelease, "q", subjects.ReleaseRequest{ID: id, LeaseID: "any"}, subjects.CodeLeaseMismatch},
			errCase{"complete no lease " + id, subjects.OpComplete, "q", subjects.LeaseRequest{ID: id}, subjects.CodeBadRequest},
		)
	}
	runErrCases(t, e, ref, cases)
}

// TestErrWrongStateTerminal covers transitions from completed, released, canceled and errored.
func TestErrWrongStateTerminal(t *testing.T) {
	t.Parallel()
	e := setup(t)
	leased := func(queue, id string) string {
		t.Helper()
		e.enqueue(queue, subjects.EnqueueRequest{ID: id, Payload: "x"})
		m := e.dequeueOne(queue)
		if m.ID != id {
			t.Fatalf("dequeue %s: got %s, want %s", queue, m.ID, id)
		}
		return m.LeaseID
	}

	// Completed.
	lc := leased("c", "c")
	done := must[subjects.Message](e, subjects.OpComplete, "c", subjects.LeaseRequest{ID: "c", LeaseID: lc})
	runErrCases(t, e, []msgRef{{"c", "c"}}, []errCase{
		{"extend completed", subjects.OpExtend, "c", subjects.ExtendRequest{ID: "c", LeaseID: lc}, subjects.CodeInvalidState},
		{"release completed", subjects.OpRelease, "c", subjects.ReleaseRequest{ID: "c", LeaseID: lc}, subjects.CodeInvalidState},
		{"cancel completed", subjects.OpCancel, "c", subjects.LeaseRequest{ID: "c"}, subjects.CodeInvalidState},
		{"cancel completed with lease", subjects.OpCancel, "c", subjects.LeaseRequest{ID: "c", LeaseID: lc}, subjects.CodeInvalidState},
		{"complete completed wrong lease", subjects.OpComplete, "c", subjects.LeaseRequest{ID: "c", LeaseID: "wrong"}, subjects.CodeLeaseMismatch},
	})
	// Completing again with the same lease is an idempotent success that writes nothing.
	before := e.snap(msgRef{"c", "c"})
	if again := must[subjects.Message](e, subjects.OpComplete, "c", subjects.LeaseRequest{ID: "c", LeaseID: lc}); again.Version != done.Version {
		t.Fatalf("complete again: %+v, first %+v", again, done)
	}
	e.unchanged(before)

	// Released.
	lr := leased("r", "r")
	rel := must[subjects.Message](e, subjects.OpRelease, "r", subjects.ReleaseRequest{ID: "r", LeaseID: lr})
	runErrCases(t, e, []msgRef{{"r", "r"}}, []errCase{
		{"complete released", subjects.OpComplete, "r", subjects.LeaseRequest{ID: "r", LeaseID: lr}, subjects.CodeInvalidState},
		{"extend released", subjects.OpExtend, "r", subjects.ExtendRequest{ID: "r", LeaseID: lr}, subjects.CodeInvalidState},
	})
	before = e.snap(msgRef{"r", "r"})
	if again := must[subjects.Message](e, subjects.OpRelease, "r", subjects.ReleaseRequest{ID: "r", LeaseID: lr}); again.Version != rel.Version {
		t.Fatalf("release again: %+v, first %+v", again, rel)
	}
	e.unchanged(before)

	// Released with a delay (invisible).
	ld := leased("rd", "rd")
	must[subjects.Message](e, subjects.OpRelease, "rd", subjects.ReleaseRequest{ID: "rd", LeaseID: ld, DelayMS: 60_000})
	runErrCases(t, e, []msgRef{{"rd", "rd"}}, []errCase{
		{"complete released invisible", subjects.OpComplete, "rd", subjects.LeaseRequest{ID: "rd", LeaseID: ld}, subjects.CodeInvalidState},
		{"extend released invisible", subjects.OpExtend, "rd", subjects.ExtendRequest{ID: "rd", LeaseID: ld}, subjects.CodeInvalidState},
	})

	// Canceled while running (unconditionally, by an operator).
	lx := leased("x", "x")
	must[subjects.Message](e, subjects.OpCancel, "x", subjects.LeaseRequest{ID: "x"})
	runErrCases(t, e, []msgRef{{"x", "x"}}, []errCase{
		{"complete canceled", subjects.OpComplete, "x", subjects.LeaseRequest{ID: "x", LeaseID: lx}, subjects.CodeInvalidState},
		{"extend canceled", subjects.OpExtend, "x", subjects.ExtendRequest{ID: "x", LeaseID: lx}, subjects.CodeInvalidState},
		{"release canceled", subjects.OpRelease, "x", subjects.ReleaseRequest{ID: "x", LeaseID: lx}, subjects.CodeInvalidState},
	})

	// Canceled while pending: it never had a lease.
	e.enqueue("xp", subjects.EnqueueRequest{ID: "xp"})
	must[subjects.Message](e, subjects.OpCancel, "xp", subjects.LeaseRequest{ID: "xp"})
	t.Run("complete canceled pending", func(t *testing.T) {
		se := e.on(t)
		before := se.snap(msgRef{"xp", "xp"})
		_, err := call[json.RawMessage](se, subjects.OpComplete, "xp", subjects.LeaseRequest{ID: "xp", LeaseID: "any"})
		if err == nil || (err.Code != subjects.CodeInvalidState && err.Code != subjects.CodeLeaseMismatch) {
			t.Fatalf("complete of a message canceled while pending: %v, want invalid_state or lease_mismatch", err)
		}
		t.Logf("complete of a message canceled while pending: %s (%s)", err.Code, err.Message)
		se.unchanged(before)
	})

	// Errored: released with no attempts left.
	e.create("e", subjects.CreateQueueRequest{MaxAttempts: 1})
	le := leased("e", "e")
	if m := must[subjects.Message](e, subjects.OpRelease, "e", subjects.ReleaseRequest{ID: "e", LeaseID: le}); m.State != subjects.StateErrored {
		t.Fatalf("release with no attempts left: %+v", m)
	}
	runErrCases(t, e, []msgRef{{"e", "e"}}, []errCase{
		{"cancel errored", subjects.OpCancel, "e", subjects.LeaseRequest{ID: "e"}, subjects.CodeInvalidState},
		{"complete errored", subjects.OpComplete, "e", subjects.LeaseRequest{ID: "e", LeaseID: le}, subjects.CodeInvalidState},
		{"extend errored", subjects.OpExtend, "e", subjects.ExtendRequest{ID: "e", LeaseID: le}, subjects.CodeInvalidState},
		{"cancel errored with its released lease", subjects.OpCancel, "e", subjects.LeaseRequest{ID: "e", LeaseID: le}, subjects.CodeInvalidState},
	})

	// Errored: its lease ran out with no attempts left. Its holder's cancel is answered as its
	// complete is.
	e.create("ee", subjects.CreateQueueRequest{MaxAttempts: 1})
	lee := leased("ee", "ee")
	e.advance(time.Minute)
	if m := e.get("ee", "ee"); m.State != subjects.StateErrored {
		t.Fatalf("a lease run out with no attempts left: %s", m.State)
	}
	runErrCases(t, e, []msgRef{{"ee", "ee"}}, []errCase{
		{"complete expired into errored", subjects.OpComplete, "ee", subjects.LeaseRequest{ID: "ee", LeaseID: lee}, subjects.CodeLeaseExpired},
		{"cancel expired into errored", subjects.OpCancel, "ee", subjects.LeaseRequest{ID: "ee", LeaseID: lee}, subjects.CodeLeaseExpired},
		{"cancel errored wrong lease", subjects.OpCancel, "ee", subjects.LeaseRequest{ID: "ee", LeaseID: "wrong"}, subjects.CodeLeaseMismatch},
		{"cancel errored by an operator", subjects.OpCancel, "ee", subjects.LeaseRequest{ID: "ee"}, subjects.CodeInvalidState},
	})
}

// TestErrManyErrorReplies sends many failing requests in a row. Under -race it shows whether the
// error replies, sent from the request's own goroutine, race with the micro framework's bookkeeping
// (micro reads the request's respondError after the handler returns).
func TestErrManyErrorReplies(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	before := e.snap()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 250 {
				subj, body := e.space.Subject(subjects.OpInfo, "ghost"), []byte(nil)
				want := subjects.CodeQueueNotFound
				if (w+i)%2 == 1 {
					subj, body, want = e.space.Subject(subjects.OpEnqueue, "q"), []byte("{"), subjects.CodeBadRequest
				}
				msg, err := e.nc.Request(subj, body, 10*time.Second)
				if err != nil {
					t.Errorf("%s: %v", subj, err)
					return
				}
				var er subjects.ErrorReply
				if json.Unmarshal(msg.Data, &er) != nil || er.Error == nil || er.Error.Code != want ||
					msg.Header.Get("Nats-Service-Error") == "" || msg.Header.Get("Nats-Service-Error-Code") != strconv.Itoa(want.Status()) {
					t.Errorf("%s: reply %q headers %v, want %s", subj, msg.Data, msg.Header, want)
					return
				}
			}
		})
	}
	wg.Wait()
	e.unchanged(before)
}

// ---- helpers ----

// errCase is one request that must fail with code.
type errCase struct {
	name  string
	op    subjects.Op
	queue string
	body  any
	code  subjects.Code
}

// msgRef names a message whose state a snapshot records.
type msgRef struct{ queue, id string }

// on returns a copy of e reporting to t (a subtest's), so that failures stop the right goroutine.
func (e *env) on(t *testing.T) *env {
	c := *e
	c.t = t
	return &c
}

// runErrCases runs each case as a subtest: it must fail with its code (with the error headers and a
// message) and change nothing: not the queue list, not the storage, not the watched messages.
func runErrCases(t *testing.T, e *env, watch []msgRef, cases []errCase) {
	t.Helper()
	for _, tc := range cases {
		name := tc.name
		if name == "" {
			name = fmt.Sprintf("%s %s", tc.op, tc.queue)
		}
		t.Run(name, func(t *testing.T) {
			se := e.on(t)
			before := se.snap(watch...)
			se.fail(tc.code, tc.op, tc.queue, tc.body)
			se.unchanged(before)
		})
	}
}

// fail sends a request that must fail with code.
func (e *env) fail(code subjects.Code, op subjects.Op, queue string, body any) *subjects.Error {
	e.t.Helper()
	return e.checkErrReply(e.request(op, queue, body), code, fmt.Sprintf("%s %.40s", op, queue))
}

// checkErrReply checks msg is an error reply with code (any code if code is "") carrying the micro
// error headers: Nats-Service-Error-Code with the code's status and a non-empty Nats-Service-Error
// equal to the body's message.
func (e *env) checkErrReply(msg *nats.Msg, code subjects.Code, what string) *subjects.Error {
	e.t.Helper()
	var er subjects.ErrorReply
	status := msg.Header.Get("Nats-Service-Error-Code")
	if status == "" {
		e.t.Fatalf("%s: succeeded with %.300s, want %s", what, msg.Data, code)
	}
	if err := json.Unmarshal(msg.Data, &er); err != nil || er.Error == nil {
		e.t.Fatalf("%s: error reply %s with body %q: %v", what, status, msg.Data, err)
	}
	if code != "" && er.Error.Code != code {
		e.t.Fatalf("%s: got %s (%s), want %s", what, er.Error.Code, er.Error.Message, code)
	}
	if want := strconv.Itoa(er.Error.Code.Status()); status != want {
		e.t.Errorf("%s: %s sent with Nats-Service-Error-Code %s, want %s", what, er.Error.Code, status, want)
	}
	if strings.TrimSpace(er.Error.Message) == "" {
		e.t.Errorf("%s: %s with an empty message", what, er.Error.Code)
	}
	if desc := msg.Header.Get("Nats-Service-Error"); desc != er.Error.Message {
		e.t.Errorf("%s: Nats-Service-Error %q, want the message %q", what, desc, er.Error.Message)
	}
	return er.Error
}

// raw sends an enqueue_raw request with the headers as given (names not canonicalised).
func (e *env) raw(queue string, hdr map[string]string, body []byte) *nats.Msg {
	e.t.Helper()
	m := &nats.Msg{Subject: e.space.Subject(subjects.OpEnqueueRaw, queue), Data: body, Header: nats.Header{}}
	for k, v := range hdr {
		m.Header[k] = []string{v}
	}
	reply, err := e.nc.RequestMsg(m, 10*time.Second)
	if err != nil {
		e.t.Fatalf("enqueue_raw %s: %v", queue, err)
	}
	return reply
}

// rawOK is raw that must succeed.
func (e *env) rawOK(queue string, hdr map[string]string, body []byte) subjects.EnqueueReply {
	e.t.Helper()
	r, err := decodeReply[subjects.EnqueueReply](e.t, e.raw(queue, hdr, body))
	if err != nil {
		e.t.Fatalf("enqueue_raw %s: %v", queue, err)
	}
	return r
}

// snapshot is what a rejected request must not change.
type snapshot struct {
	queues  string            // the list reply, as JSON
	streams map[string]string // every JetStream stream's message count and last sequence
	msgs    []string          // the watched messages (get replies), as JSON
	refs    []msgRef
}

func (e *env) snap(refs ...msgRef) snapshot {
	e.t.Helper()
	s := snapshot{streams: make(map[string]string), refs: refs}
	list := must[subjects.ListReply](e, subjects.OpList, "", nil)
	b, _ := json.Marshal(list)
	s.queues = string(b)
	js := e.jetStream()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.b.FlushEvents(ctx); err != nil { // the events of the setup, published asynchronously
		e.t.Fatal(err)
	}
	l := js.ListStreams(ctx)
	for si := range l.Info() {
		if si.Config.Name == "KV_natstone-claims" {
			continue // the broker renews its claim on the store every few seconds
		}
		s.streams[si.Config.Name] = fmt.Sprintf("msgs=%d last=%d deleted=%d", si.State.Msgs, si.State.LastSeq, si.State.NumDeleted)
	}
	if err := l.Err(); err != nil {
		e.t.Fatalf("list streams: %v", err)
	}
	for _, r := range refs {
		b, _ := json.Marshal(e.get(r.queue, r.id))
		s.msgs = append(s.msgs, string(b))
	}
	return s
}

// unchanged fails the test if anything recorded in before changed.
func (e *env) unchanged(before snapshot) {
	e.t.Helper()
	after := e.snap(before.refs...)
	if after.queues != before.queues {
		e.t.Errorf("queue list changed:\n before %s\n after  %s", before.queues, after.queues)
	}
	for name, b := range before.streams {
		if a := after.streams[name]; a != b {
			e.t.Errorf("stream %s changed: before %s, after %s", name, b, a)
		}
	}
	for name, a := range after.streams {
		if _, ok := before.streams[name]; !ok {
			e.t.Errorf("stream %s appeared: %s", name, a)
		}
	}
	for i := range before.msgs {
		if after.msgs[i] != before.msgs[i] {
			e.t.Errorf("message %s/%s changed:\n before %s\n after  %s", before.refs[i].queue, before.refs[i].id, before.msgs[i], after.msgs[i])
		}
	}
}

// notFoundCases are the operations on an existing queue, with valid bodies, against queue.
func notFoundCases(queue string) []errCase {
	return []errCase{
		{"info " + queue, subjects.OpInfo, queue, nil, subjects.CodeQueueNotFound},
		{"update " + queue, subjects.OpUpdate, queue, subjects.UpdateQueueRequest{LeaseMS: ptr(int64(1000))}, subjects.CodeQueueNotFound},
		{"delete " + queue, subjects.OpDelete, queue, nil, subjects.CodeQueueNotFound},
		{"dequeue " + queue, subjects.OpDequeue, queue, subjects.DequeueRequest{}, subjects.CodeQueueNotFound},
		{"dequeue wait " + queue, subjects.OpDequeue, queue, subjects.DequeueRequest{WaitMS: 1000}, subjects.CodeQueueNotFound},
		{"complete " + queue, subjects.OpComplete, queue, subjects.LeaseRequest{ID: "m1", LeaseID: "L"}, subjects.CodeQueueNotFound},
		{"extend " + queue, subjects.OpExtend, queue, subjects.ExtendRequest{ID: "m1", LeaseID: "L"}, subjects.CodeQueueNotFound},
		{"release " + queue, subjects.OpRelease, queue, subjects.ReleaseRequest{ID: "m1", LeaseID: "L"}, subjects.CodeQueueNotFound},
		{"cancel " + queue, subjects.OpCancel, queue, subjects.LeaseRequest{ID: "m1"}, subjects.CodeQueueNotFound},
		{"get " + queue, subjects.OpGet, queue, subjects.GetRequest{ID: "m1"}, subjects.CodeQueueNotFound},
		{"depth " + queue, subjects.OpDepth, queue, nil, subjects.CodeQueueNotFound},
		{"schedules " + queue, subjects.OpSchedules, queue, nil, subjects.CodeQueueNotFound},
	}
}

// TestErrLongRequestsGetTheirErrors: an error message may quote the request (a lease id, an
// unknown field's name, a cursor); quoted whole, a request of half the server's max_payload made a
// reply the server refused, and the client got no answer at all. The message is cut instead.
func TestErrLongRequestsGetTheirErrors(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.enqueueInOrder("q", "m")
	e.dequeueOne("q")
	long := strings.Repeat(`"`, 300_000) // each doubles when quoted
	for _, tc := range []struct {
		op   subjects.Op
		body any
		code subjects.Code
	}{
		{subjects.OpComplete, subjects.LeaseRequest{ID: "m", LeaseID: long}, subjects.CodeLeaseMismatch},
		{subjects.OpCreate, subjects.CreateQueueRequest{Type: subjects.QueueType(long)}, subjects.CodeInvalidConfig},
		{subjects.OpEnqueue, map[string]int{long: 1}, subjects.CodeBadRequest},
		{subjects.OpBrowse, subjects.BrowseRequest{State: subjects.StatePending, After: long}, subjects.CodeBadRequest},
	} {
		queue := "q"
		if tc.op == subjects.OpCreate {
			queue = "new"
		}
		msg := e.request(tc.op, queue, tc.body)
		er := e.checkErrReply(msg, tc.code, string(tc.op))
		if n := len(er.Message); n > 1100 || !strings.HasSuffix(er.Message, " …") {
			t.Errorf("%s: a message of %d bytes, want it cut at 1 KiB: %.80s…", tc.op, n, er.Message)
		}
	}
}

// TestErrEnqueueRetryAfterLimitsLowered: a retried enqueue of a message the queue holds is a
// duplicate, even once the queue's limits were lowered below what the message has (its payload's
// size, its metadata's pairs); a new message is held to them.
func TestErrEnqueueRetryAfterLimitsLowered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.create("q", subjects.CreateQueueRequest{})
	m := subjects.EnqueueRequest{ID: "r1", Payload: strings.Repeat("x", 100), Metadata: map[string]string{"a": "1", "b": "2"}}
	e.enqueue("q", m)
	must[subjects.QueueInfo](e, subjects.OpUpdate, "q", subjects.UpdateQueueRequest{MaxPayloadBytes: ptr(10), MaxMetadataPairs: ptr(1)})
	before := e.snap(msgRef{"q", "r1"})
	if r := e.enqueue("q", m); !r.Duplicate {
		t.Fatalf("the retry: %+v, want duplicate", r)
	}
	if r := must[subjects.EnqueueBatchReply](e, subjects.OpEnqueueBatch, "q", subjects.EnqueueBatchRequest{Messages: []subjects.EnqueueRequest{m}}); !r.Messages[0].Duplicate {
		t.Fatalf("the retry in a batch: %+v, want duplicate", r)
	}
	e.unchanged(before)
	fresh := m
	fresh.ID = "r2"
	fails(e, subjects.CodePayloadTooLarge, subjects.OpEnqueue, "q", fresh)
	fresh.Payload = "x"
	fails(e, subjects.CodeInvalidMetadata, subjects.OpEnqueue, "q", fresh)
	// Still checked whatever the queue: natstone's own limits, and the metadata's form.
	bad := m
	bad.Metadata = map[string]string{"a": "1", "": "2"}
	fails(e, subjects.CodeInvalidMetadata, subjects.OpEnqueue, "q", bad)
}
