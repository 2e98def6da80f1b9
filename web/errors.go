package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// inputError is a request refused before the broker was asked.
type inputError struct {
	status int
	code   subjects.Code
	msg    string
}

// Error implements error.
func (e *inputError) Error() string { return string(e.code) + ": " + e.msg }

// badRequest returns a 400 bad_request error.
func badRequest(format string, args ...any) *inputError {
	return &inputError{status: http.StatusBadRequest, code: subjects.CodeBadRequest, msg: fmt.Sprintf(format, args...)}
}

// errorReply is the body of every failed request, the same shape as the broker's error replies.
type errorReply struct {
	Error subjects.Error `json:"error"`
}

// writeError answers r with err: an input error or a broker error reply keeps its code and status;
// anything else means the broker could not be reached and is 503 unavailable.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, code, msg := classify(err)
	if status >= 500 && r.Context().Err() == nil {
		s.log.Warn("web: request failed", "method", r.Method, "path", r.URL.Path, "status", status, "error", err)
	}
	writeJSON(w, status, errorReply{Error: subjects.Error{Code: code, Message: msg}})
}

// classify returns the HTTP status, code and message of err.
func classify(err error) (status int, code subjects.Code, msg string) {
	var in *inputError
	if errors.As(err, &in) {
		return in.status, in.code, in.msg
	}
	var api *workers.APIError
	if errors.As(err, &api) {
		return api.Code.Status(), api.Code, api.Message
	}
	if errors.Is(err, context.Canceled) {
		// The client went away; nobody reads this reply.
		return http.StatusServiceUnavailable, subjects.CodeUnavailable, "request canceled"
	}
	return http.StatusServiceUnavailable, subjects.CodeUnavailable, err.Error()
}

// writeJSON writes v as the JSON body of a reply with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Every reply is made of plain data; this is a bug.
		status = http.StatusInternalServerError
		body, _ = json.Marshal(errorReply{Error: subjects.Error{Code: subjects.CodeInternal, Message: err.Error()}})
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
