package workers

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/natstone/natstone/subjects"
)

// DefaultTimeout bounds one request of a Client unless Config.Timeout says otherwise.
const DefaultTimeout = 10 * time.Second

// Config configures a Client.
type Config struct {
	// Prefix of the broker's subjects. Default subjects.DefaultPrefix ("natstone.v1"); it must match
	// the broker's --prefix.
	Prefix string
	// Timeout bounds each request, on top of the caller's context. A dequeue's Wait is added to it,
	// so a long poll is never cut short. Default DefaultTimeout.
	Timeout time.Duration
	// IgnoreAnnouncements makes the Client not subscribe to the brokers' announcements that they
	// serve (subjects.Space.Serving), for a NATS user not allowed to: a long poll parked at a
	// broker that dies while its NATS server stays up then waits out its wait and Timeout (see
	// Dequeue).
	IgnoreAnnouncements bool
}

// Client sends natstone's requests over a NATS connection. Each method sends one request and waits
// for its reply, except Queues and Schedules, which page through as many as the listing takes, and
// Dequeue, which abandons its long poll (Abandon) when its context ends first. A Client is safe for
// concurrent use; it holds no state besides its config. (Its connection gets one subscription, at
// the first long poll with a RequestID of any Client on it under the same prefix that does not
// ignore them: the brokers' announcements that they serve, subjects.Space.Serving, which cut such
// polls parked at a broker that is gone; see Dequeue and Config.IgnoreAnnouncements.)
//
// Errors: an error reply of the broker is an [*APIError] matching one of the Err… sentinels. A
// transport failure is returned wrapped, so errors.Is works on the nats.go errors:
//   - nats.ErrTimeout: no reply within Config.Timeout (plus a dequeue's wait), or the wait for it
//     dropped by a forced reconnect of the connection (the error matches nats.ErrDisconnected too).
//     The request may still have been carried out; every natstone write is idempotent, so retrying
//     it is safe (a dequeue is only when retried with the same RequestID).
//   - nats.ErrNoResponders: nothing listens on the subject — no broker is running for this prefix
//     (or the connection may not publish to it).
//   - the caller's context error when ctx ends first.
type Client struct {
	nc                  *nats.Conn
	space               subjects.Space
	timeout             time.Duration
	ignoreAnnouncements bool
}

// NewClient returns a Client that sends requests over nc. cfg may be nil for the defaults. The Client
// does not close nc.
func NewClient(nc *nats.Conn, cfg *Config) (*Client, error) {
	if nc == nil {
		return nil, errors.New("natstone: NewClient: nil *nats.Conn")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Timeout < 0 {
		return nil, fmt.Errorf("natstone: client Config.Timeout %v is negative", c.Timeout)
	}
	space, err := subjects.NewSpace(c.Prefix)
	if err != nil {
		return nil, prefixError("client Config.Prefix", c.Prefix)
	}
	return &Client{nc: nc, space: space, timeout: cmp.Or(c.Timeout, DefaultTimeout), ignoreAnnouncements: c.IgnoreAnnouncements}, nil
}

// request sends body (JSON-encoded) as op on queue and decodes the reply into out.
func (c *Client) request(ctx context.Context, op subjects.Op, queue string, body, out any) error {
	var data []byte
	if body != nil {
		var err error
		if data, err = encodeRequest(op, queue, body); err != nil {
			return err
		}
	}
	return c.send(ctx, op, queue, &nats.Msg{Data: data}, 0, out)
}

// opOn names op on queue in an error: "get q", or "list" alone.
func opOn(op subjects.Op, queue string) string {
	if op == subjects.OpEnqueueRaw {
		op = subjects.OpEnqueue // Enqueue's form on the wire, not another operation to the caller
	}
	if queue == "" {
		return string(op)
	}
	return string(op) + " " + queue
}

// encodeRequest returns the JSON of v, for op on queue. A string of v that is not valid UTF-8 is
// an *APIError as the broker's would be (bad_request): json.Marshal would send each invalid byte as
// U+FFFD, so that the broker would get another id, key or value than the caller's, and two ids
// could become one.
func encodeRequest(op subjects.Op, queue string, v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("natstone: %s: encode request: %w", opOn(op, queue), err)
	}
	// json.Marshal writes a U+FFFD it was given as is, and one it made as this escape (which a
	// string's own backslash, escaped as \\, can also end in: then the walk finds nothing).
	if bytes.Contains(data, []byte(`\ufffd`)) {
		if s, bad := invalidText(reflect.ValueOf(v)); bad {
			return nil, apiError(subjects.Errorf(subjects.CodeBadRequest, "%q is not valid UTF-8", s))
		}
	}
	return data, nil
}

// invalidText returns the first string in v (structs, pointers, maps and slices of them, as request
// bodies are) that is not valid UTF-8. Byte slices are payloads, sent as base64, and not looked at.
func invalidText(v reflect.Value) (string, bool) {
	switch v.Kind() {
	case reflect.String:
		return v.String(), !utf8.ValidString(v.String())
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return invalidText(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if s, bad := invalidText(v.Field(i)); bad {
				return s, true
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if s, bad := invalidText(it.Key()); bad {
				return s, true
			}
			if s, bad := invalidText(it.Value()); bad {
				return s, true
			}
		}
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return "", false
		}
		for i := range v.Len() {
			if s, bad := invalidText(v.Index(i)); bad {
				return s, true
			}
		}
	}
	return "", false
}

// send sends msg as op on queue, waiting up to the client's timeout plus extra, and decodes a
// successful reply into out.
func (c *Client) send(ctx context.Context, op subjects.Op, queue string, msg *nats.Msg, extra time.Duration, out any) error {
	if op != subjects.OpList {
		if err := subjects.ValidateQueueName(queue); err != nil {
			// Not a valid subject token: the broker could not even be asked. Report it as the
			// broker would.
			var e *subjects.Error
			if errors.As(err, &e) {
				return apiError(e)
			}
			return err
		}
	}
	msg.Subject = c.space.Subject(op, queue)
	rctx, cancel := context.WithTimeout(ctx, c.timeout+extra)
	defer cancel()
	reply, err := c.nc.RequestMsgWithContext(rctx, msg)
	if err != nil {
		if errors.Is(err, nats.ErrMaxPayload) {
			// Not sent: the server takes no message this large, whatever the queue would.
			return apiError(subjects.Errorf(subjects.CodePayloadTooLarge, "%s: the request of %d bytes is larger than the NATS server takes (max_payload, %d bytes)",
				opOn(op, queue), len(msg.Data), c.nc.MaxPayload()))
		}
		switch {
		case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			err = nats.ErrTimeout // our own timeout, not the caller's context
		case errors.Is(err, nats.ErrDisconnected):
			// nats.go dropped the wait for the reply at a forced reconnect (Conn.ForceReconnect,
			// which a rotation of credentials calls): the request was sent, its outcome unknown.
			err = fmt.Errorf("%w (%w)", nats.ErrTimeout, err)
		}
		return fmt.Errorf("natstone: %s: %w", opOn(op, queue), err)
	}
	if e := decodeError(reply); e != nil {
		return e
	}
	if err := json.Unmarshal(reply.Data, out); err != nil {
		return fmt.Errorf("natstone: %s: decode reply: %w", opOn(op, queue), err)
	}
	return nil
}

// decodeError returns the *APIError a reply carries, or nil for a successful reply. The body is the
// source of truth; the micro error headers only say that it is an error reply.
func decodeError(reply *nats.Msg) *APIError {
	status := reply.Header.Get(micro.ErrorCodeHeader)
	if status == "" && !bytes.HasPrefix(bytes.TrimSpace(reply.Data), []byte(`{"error":`)) {
		return nil
	}
	var er subjects.ErrorReply
	if err := json.Unmarshal(reply.Data, &er); err != nil || er.Error == nil {
		// Not a natstone body (another micro service on the subject?): keep what the headers say.
		n, _ := strconv.Atoi(status)
		return &APIError{Code: subjects.CodeInternal, Message: reply.Header.Get(micro.ErrorHeader), Status: n}
	}
	e := apiError(er.Error)
	if n, err := strconv.Atoi(status); err == nil {
		e.Status = n
	}
	return e
}

// ms converts a duration to whole milliseconds for the wire, rounding down.
func ms(d time.Duration) int64 { return d.Milliseconds() }

// msPtr is ms for an optional duration.
func msPtr(d *time.Duration) *int64 {
	if d == nil {
		return nil
	}
	v := ms(*d)
	return &v
}

// timeOrZero returns *t, or the zero time for nil.
func timeOrZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
