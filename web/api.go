package web

import (
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// statsConcurrency bounds the stats requests one GET /api/queues has in flight.
const statsConcurrency = 8

// QueuesPage is how many queues GET /api/queues lists by default, and MaxQueuesPage the most it
// lists: each costs a stats request at every refresh of the page (every 2 s), and a broker of
// 10,000 queues took half a second of CPU to answer them all.
const (
	QueuesPage    = 100
	MaxQueuesPage = 1000
)

// api adapts a handler that returns its reply, or an error to answer with. Request bodies are
// limited to maxBodyBytes.
func (s *Server) api(h func(*http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
		v, err := h(r)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

// queueSummary is one queue of GET /api/queues.
type queueSummary struct {
	Name            string             `json:"name"`
	Type            subjects.QueueType `json:"type"`
	ExclusivityKey  string             `json:"exclusivity_key,omitempty"`
	EnqueueBlocked  bool               `json:"enqueue_blocked"`
	DequeueBlocked  bool               `json:"dequeue_blocked"`
	Counts          subjects.Counts    `json:"counts"`
	OldestPendingMS int64              `json:"oldest_pending_ms"`
	Rates           subjects.Rates     `json:"rates"`
}

// queuesReply is the reply of GET /api/queues.
type queuesReply struct {
	Queues []queueSummary `json:"queues"`
	Limit  int            `json:"limit"`
	More   bool           `json:"more"`
	Next   string         `json:"next,omitempty"` // with more: the after of the next page
}

// listQueues answers GET /api/queues: a page of the list (after, limit), then the stats of each of
// its queues, a few at a time.
func (s *Server) listQueues(r *http.Request) (any, error) {
	q, err := query(r.URL, []string{"after", "limit"})
	if err != nil {
		return nil, err
	}
	limit, err := parseLimit(q.Get("limit"), QueuesPage, MaxQueuesPage)
	if err != nil {
		return nil, err
	}
	ctx := r.Context()
	infos, more, err := s.client.ListQueues(ctx, &workers.ListOpts{After: q.Get("after"), Limit: limit})
	if err != nil {
		return nil, err
	}
	stats := make([]*subjects.StatsReply, len(infos))
	errs := make([]error, len(infos))
	sem := make(chan struct{}, statsConcurrency)
	var wg sync.WaitGroup
	for i := range infos {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			st, err := s.client.Stats(ctx, infos[i].Name, &workers.StatsOpts{ExpiringLimit: 1})
			switch {
			case errors.Is(err, workers.ErrQueueNotFound):
				// Deleted since the list: leave it out.
			case err != nil:
				errs[i] = err
			default:
				stats[i] = &st
			}
		})
	}
	wg.Wait()
	reply := queuesReply{Queues: make([]queueSummary, 0, len(infos)), Limit: limit, More: more}
	if more {
		reply.Next = infos[len(infos)-1].Name
	}
	for i, st := range stats {
		if errs[i] != nil {
			return nil, errs[i]
		}
		if st == nil {
			continue
		}
		reply.Queues = append(reply.Queues, queueSummary{
			Name:            infos[i].Name,
			Type:            st.Config.Type,
			ExclusivityKey:  st.Config.ExclusivityKey,
			EnqueueBlocked:  st.Config.EnqueueBlocked,
			DequeueBlocked:  st.Config.DequeueBlocked,
			Counts:          st.Counts,
			OldestPendingMS: st.OldestPendingMS,
			Rates:           st.Rates,
		})
	}
	return reply, nil
}

// queueReply is the reply of GET /api/queues/{name}.
type queueReply struct {
	Name            string                   `json:"name"`
	Revision        uint64                   `json:"revision"`
	CreatedAt       time.Time                `json:"created_at"`
	Config          subjects.QueueConfig     `json:"config"`
	Filter          map[string]string        `json:"filter,omitempty"`
	At              time.Time                `json:"at"`
	Counts          subjects.Counts          `json:"counts"`
	OldestPendingMS int64                    `json:"oldest_pending_ms"`
	Rates           subjects.Rates           `json:"rates"`
	Totals          subjects.Totals          `json:"totals"`
	Expiring        []subjects.ExpiringLease `json:"expiring"`
	Schedules       []subjects.ScheduleInfo  `json:"schedules"`
}

// getQueue answers GET /api/queues/{name}: info (for the revision and creation time), stats and
// the schedules.
func (s *Server) getQueue(r *http.Request) (any, error) {
	q, err := query(r.URL, []string{"filter"}, "filter")
	if err != nil {
		return nil, err
	}
	filter, err := parseFilter(q["filter"])
	if err != nil {
		return nil, err
	}
	ctx, name := r.Context(), r.PathValue("name")
	info, err := s.client.Queue(ctx, name)
	if err != nil {
		return nil, err
	}
	st, err := s.client.Stats(ctx, name, &workers.StatsOpts{Filter: filter})
	if err != nil {
		return nil, err
	}
	if st.Expiring == nil {
		st.Expiring = []subjects.ExpiringLease{}
	}
	schedules, err := s.client.Schedules(ctx, name)
	if err != nil && !errors.Is(err, nats.ErrNoResponders) {
		return nil, err // (no responders: a broker from before schedules, which answered the rest)
	}
	if schedules == nil {
		schedules = []subjects.ScheduleInfo{}
	}
	return queueReply{
		Name:            info.Name,
		Revision:        info.Revision,
		CreatedAt:       info.CreatedAt,
		Config:          info.Config,
		Filter:          filter,
		At:              st.At,
		Counts:          st.Counts,
		OldestPendingMS: st.OldestPendingMS,
		Rates:           st.Rates,
		Totals:          st.Totals,
		Expiring:        st.Expiring,
		Schedules:       schedules,
	}, nil
}

// message is a message as the API shows it: the wire form, here without its payload.
type message = subjects.Message

// newMessage converts a client's message.
func newMessage(m *workers.Message) message {
	return message{
		ID:             m.ID,
		Queue:          m.Queue,
		State:          m.State,
		Priority:       m.Priority,
		Metadata:       m.Metadata,
		Version:        m.Version,
		Attempts:       m.Attempts,
		AttemptsLeft:   m.AttemptsLeft,
		LeaseID:        m.LeaseID,
		LeaseExpiresAt: optionalTime(m.LeaseExpiresAt),
		EnqueuedAt:     m.EnqueuedAt,
		VisibleAt:      m.VisibleAt,
		UpdatedAt:      m.UpdatedAt,
		EndedAt:        optionalTime(m.EndedAt),
	}
}

// optionalTime returns nil for the zero time, so that JSON leaves it out.
func optionalTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// messagesReply is the reply of GET /api/queues/{name}/messages.
type messagesReply struct {
	Queue    string            `json:"queue"`
	State    subjects.State    `json:"state"`
	Filter   map[string]string `json:"filter,omitempty"`
	Limit    int               `json:"limit"`
	Messages []message         `json:"messages"`
	More     bool              `json:"more"`
	Next     string            `json:"next,omitempty"` // with more: the after of the next page
}

// listMessages answers GET /api/queues/{name}/messages with a browse.
func (s *Server) listMessages(r *http.Request) (any, error) {
	q, err := query(r.URL, []string{"state", "filter", "limit", "after"}, "filter")
	if err != nil {
		return nil, err
	}
	state, err := parseState(q.Get("state"))
	if err != nil {
		return nil, err
	}
	filter, err := parseFilter(q["filter"])
	if err != nil {
		return nil, err
	}
	limit, err := parseLimit(q.Get("limit"), subjects.DefaultBrowseLimit, subjects.MaxBrowseLimit)
	if err != nil {
		return nil, err
	}
	name := r.PathValue("name")
	msgs, next, err := s.client.Browse(r.Context(), name, state, &workers.BrowseOpts{Filter: filter, Limit: limit, After: q.Get("after")})
	if err != nil {
		return nil, err
	}
	reply := messagesReply{Queue: name, State: state, Filter: filter, Limit: limit, Messages: make([]message, len(msgs)), More: next != "", Next: next}
	for i := range msgs {
		reply.Messages[i] = newMessage(&msgs[i])
	}
	return reply, nil
}

// messageDetail is a message with its payload, when small enough to show.
type messageDetail struct {
	message
	PayloadSize    int     `json:"payload_size"`
	Payload        *string `json:"payload,omitempty"`        // valid UTF-8 of at most MaxPayloadPreview bytes
	PayloadBase64  []byte  `json:"payload_base64,omitempty"` // other bytes of at most MaxPayloadPreview bytes
	PayloadOmitted bool    `json:"payload_omitted,omitempty"`
}

// newMessageDetail converts a client's message, keeping its payload if it is small.
func newMessageDetail(m *workers.Message) *messageDetail {
	d := &messageDetail{message: newMessage(m), PayloadSize: len(m.Payload)}
	switch {
	case len(m.Payload) > MaxPayloadPreview:
		d.PayloadOmitted = true
	case utf8.Valid(m.Payload):
		p := string(m.Payload)
		d.Payload = &p
	default:
		d.PayloadBase64 = m.Payload
	}
	return d
}

// messageReply is the reply of GET /api/queues/{name}/messages/{id}.
type messageReply struct {
	Message      *messageDetail         `json:"message"` // nil once garbage-collected
	History      *subjects.HistoryReply `json:"history"`
	HistoryError *subjects.Error        `json:"history_error,omitempty"`
}

// getMessage answers GET /api/queues/{name}/messages/{id}: get, then history. A message that was
// garbage-collected is still answered from its history.
func (s *Server) getMessage(r *http.Request) (any, error) {
	id := r.PathValue("id")
	if id == "" {
		// GET /api/queues/{name}/message?id=: an id such as "." or "..", which a browser removes
		// from a path as a dot segment, even escaped, travels in the query.
		q, err := query(r.URL, []string{"id"})
		if err != nil {
			return nil, err
		}
		if id = q.Get("id"); id == "" {
			return nil, badRequest("query parameter id is required")
		}
	} else if _, err := query(r.URL, nil); err != nil {
		return nil, err
	}
	ctx, name := r.Context(), r.PathValue("name")
	var reply messageReply
	m, getErr := s.client.Get(ctx, name, id)
	switch {
	case getErr == nil:
		reply.Message = newMessageDetail(&m)
	case errors.Is(getErr, workers.ErrMessageNotFound):
		// Collected, perhaps: its history may remain.
	default:
		return nil, getErr
	}
	h, err := s.client.History(ctx, name, id, 0)
	switch {
	case err == nil:
		reply.History = &h
	case reply.Message == nil:
		// Neither the message nor a readable history of it: it is not found, whatever kept the
		// history from being read.
		return nil, getErr
	default:
		_, code, msg := classify(err)
		reply.HistoryError = &subjects.Error{Code: code, Message: msg}
	}
	return reply, nil
}

// blockedRequest is the body of POST /api/queues/{name}/blocked.
type blockedRequest struct {
	EnqueueBlocked *bool `json:"enqueue_blocked"`
	DequeueBlocked *bool `json:"dequeue_blocked"`
}

// setBlocked answers POST /api/queues/{name}/blocked with an update of the queue's pause flags.
func (s *Server) setBlocked(r *http.Request) (any, error) {
	if _, err := query(r.URL, nil); err != nil {
		return nil, err
	}
	req, err := decodeBlocked(r)
	if err != nil {
		return nil, err
	}
	name := r.PathValue("name")
	info, err := s.client.UpdateQueue(r.Context(), name, &workers.QueueUpdate{
		EnqueueBlocked: req.EnqueueBlocked,
		DequeueBlocked: req.DequeueBlocked,
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("web: queue flags set", "queue", name,
		"enqueue_blocked", info.Config.EnqueueBlocked, "dequeue_blocked", info.Config.DequeueBlocked,
		"remote_addr", r.RemoteAddr)
	return info, nil
}

// versionedRequest is the body of POST /api/queues/{name}/retry and /cancel, and the start of
// /reschedule's: the message and the version the page showed, so that a click acts on that message
// and nothing it became since.
type versionedRequest struct {
	ID      string `json:"id"`
	Version uint64 `json:"version"`
}

func (v *versionedRequest) versioned() *versionedRequest { return v }

// rescheduleRequest is the body of POST /api/queues/{name}/reschedule: the message, the version
// the page showed, and what changes.
type rescheduleRequest struct {
	versionedRequest
	Priority *int64 `json:"priority"`
	DelayMS  *int64 `json:"delay_ms"`
}

// retryMessage answers POST /api/queues/{name}/retry with the retried message (protocol.md's retry).
func (s *Server) retryMessage(r *http.Request) (any, error) {
	var req versionedRequest
	return s.atVersion(r, &req, `{"id": string, "version": number}`, "retried", func(ctx context.Context, queue string) (workers.Message, error) {
		return s.client.Retry(ctx, queue, req.ID, &workers.RetryOpts{Version: req.Version})
	})
}

// cancelMessage answers POST /api/queues/{name}/cancel with the canceled message: an operator's
// cancel at the version the page showed (protocol.md's cancel with version).
func (s *Server) cancelMessage(r *http.Request) (any, error) {
	var req versionedRequest
	return s.atVersion(r, &req, `{"id": string, "version": number}`, "canceled", func(ctx context.Context, queue string) (workers.Message, error) {
		return s.client.CancelAt(ctx, queue, req.ID, req.Version)
	})
}

// rescheduleMessage answers POST /api/queues/{name}/reschedule with the rescheduled message
// (protocol.md's reschedule).
func (s *Server) rescheduleMessage(r *http.Request) (any, error) {
	var req rescheduleRequest
	want := `{"id": string, "version": number, "priority": number, "delay_ms": number}`
	return s.atVersion(r, &req, want, "rescheduled", func(ctx context.Context, queue string) (workers.Message, error) {
		if req.Priority == nil && req.DelayMS == nil {
			return workers.Message{}, badRequest("body: give a priority, a delay_ms, or both")
		}
		opts := workers.RescheduleOpts{Version: req.Version, Priority: req.Priority}
		if req.DelayMS != nil {
			// Checked before it becomes a Duration, which a large value would overflow.
			if *req.DelayMS < 0 || *req.DelayMS > subjects.MaxInvisible.Milliseconds() {
				return workers.Message{}, &inputError{status: http.StatusBadRequest, code: subjects.CodeOutOfRange,
					msg: "delay_ms must be 0 to " + strconv.FormatInt(subjects.MaxInvisible.Milliseconds(), 10) + ", got " + strconv.FormatInt(*req.DelayMS, 10)}
			}
			d := time.Duration(*req.DelayMS) * time.Millisecond
			opts.Delay = &d
		}
		return s.client.Reschedule(ctx, queue, req.ID, opts)
	})
}

// noteRequest is the body of POST /api/queues/{name}/schedules/{schedule}/pause and /resume.
type noteRequest struct {
	Note string `json:"note"`
}

// pauseSchedule answers POST /api/queues/{name}/schedules/{schedule}/pause with the paused
// schedule (protocol.md's schedule_pause).
func (s *Server) pauseSchedule(r *http.Request) (any, error) {
	return s.setPaused(r, true)
}

// resumeSchedule answers POST /api/queues/{name}/schedules/{schedule}/resume with the resumed
// schedule (protocol.md's schedule_resume).
func (s *Server) resumeSchedule(r *http.Request) (any, error) {
	return s.setPaused(r, false)
}

func (s *Server) setPaused(r *http.Request, pause bool) (any, error) {
	if _, err := query(r.URL, nil); err != nil {
		return nil, err
	}
	var req noteRequest
	if err := decodeBody(r, &req, `{"note": string}`); err != nil {
		return nil, err
	}
	name, schedule := r.PathValue("name"), r.PathValue("schedule")
	set, done := s.client.ResumeSchedule, "resumed"
	if pause {
		set, done = s.client.PauseSchedule, "paused"
	}
	info, err := set(r.Context(), name, schedule, req.Note)
	if err != nil {
		return nil, err
	}
	s.log.Info("web: schedule "+done, "queue", name, "schedule", schedule, "note", info.Note, "remote_addr", r.RemoteAddr) // the note kept, if none was given
	return info, nil
}

// fireRequest is the body of POST /api/queues/{name}/schedules/{schedule}/fire.
type fireRequest struct {
	ID *string `json:"id"` // nil: none given; given empty, it is refused, as the broker refuses it
}

// fireSchedule answers POST /api/queues/{name}/schedules/{schedule}/fire with the schedule fired
// now (protocol.md's schedule_fire): its last_id is the message enqueued.
func (s *Server) fireSchedule(r *http.Request) (any, error) {
	if _, err := query(r.URL, nil); err != nil {
		return nil, err
	}
	var req fireRequest
	if err := decodeBody(r, &req, `{"id": string}`); err != nil {
		return nil, err
	}
	var id string
	if req.ID != nil {
		if id = *req.ID; id == "" {
			// The client would send it as none, and each retry would fire again.
			e := subjects.ErrFireIDEmpty
			return nil, &inputError{status: e.Code.Status(), code: e.Code, msg: e.Message}
		}
	}
	name, schedule := r.PathValue("name"), r.PathValue("schedule")
	info, err := s.client.FireSchedule(r.Context(), name, schedule, id)
	if err != nil {
		return nil, err
	}
	s.log.Info("web: schedule fired", "queue", name, "schedule", schedule, "message_id", info.LastID, "remote_addr", r.RemoteAddr)
	return info, nil
}

// atVersion reads a POST's body into req strictly (want describes it), checks that it names a
// message and a version, calls act, and logs what was done.
func (s *Server) atVersion(r *http.Request, req interface{ versioned() *versionedRequest }, want, done string,
	act func(ctx context.Context, queue string) (workers.Message, error)) (any, error) {
	if _, err := query(r.URL, nil); err != nil {
		return nil, err
	}
	if err := decodeBody(r, req, want); err != nil {
		return nil, err
	}
	v := req.versioned()
	if v.ID == "" || v.Version == 0 {
		return nil, badRequest("body: give the message's id and the version shown")
	}
	name := r.PathValue("name")
	m, err := act(r.Context(), name)
	if err != nil {
		return nil, err
	}
	s.log.Info("web: message "+done, "queue", name, "message_id", v.ID, "version", v.Version, "remote_addr", r.RemoteAddr)
	return newMessage(&m), nil
}

// decodeBlocked reads the body of a POST /api/queues/{name}/blocked strictly: JSON content type,
// known fields only, one object, at least one flag.
func decodeBlocked(r *http.Request) (blockedRequest, error) {
	var req blockedRequest
	if err := decodeBody(r, &req, `{"enqueue_blocked": bool, "dequeue_blocked": bool}`); err != nil {
		return req, err
	}
	if req.EnqueueBlocked == nil && req.DequeueBlocked == nil {
		return req, badRequest("body: give enqueue_blocked, dequeue_blocked or both")
	}
	return req, nil
}

// decodeBody reads a POST's body into v strictly: JSON content type, known fields only, one object;
// want describes the body for the error of an empty one.
func decodeBody(r *http.Request, v any, want string) error {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return &inputError{status: http.StatusUnsupportedMediaType, code: subjects.CodeBadRequest,
			msg: "Content-Type must be application/json"}
	}
	data, err := io.ReadAll(r.Body)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return &inputError{status: http.StatusRequestEntityTooLarge, code: subjects.CodeBadRequest,
			msg: "body over " + strconv.FormatInt(tooLarge.Limit, 10) + " bytes"}
	case err != nil:
		return badRequest("body: %v", err)
	case subjects.Blank(data):
		return badRequest("empty body: want %s", want)
	}
	// As strictly as the broker reads its requests: encoding/json alone takes bytes that are not
	// UTF-8 and lone surrogates as U+FFFD, and the last of a key given twice, so that a malformed
	// id would name another message (a real one named "\ufffd").
	if err := subjects.Decode(data, v); err != nil {
		var se *subjects.Error
		if errors.As(err, &se) {
			return badRequest("%s", se.Message) // "malformed JSON body: …", as the broker says it
		}
		return badRequest("body: %v", err)
	}
	return nil
}
