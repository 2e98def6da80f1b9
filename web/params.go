package web

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/natstone/natstone/subjects"
)

// query returns u's query parameters, refusing any that is not in allowed and any given more than
// once unless it is in repeatable.
func query(u *url.URL, allowed []string, repeatable ...string) (url.Values, error) {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, badRequest("query: %v", err)
	}
	for k, vs := range q {
		switch {
		case len(allowed) == 0:
			return nil, badRequest("unknown query parameter %q: this route takes none", k)
		case !slices.Contains(allowed, k):
			return nil, badRequest("unknown query parameter %q (allowed: %s)", k, strings.Join(allowed, ", "))
		}
		if len(vs) > 1 && !slices.Contains(repeatable, k) {
			return nil, badRequest("query parameter %q given %d times", k, len(vs))
		}
	}
	return q, nil
}

// parseFilter turns the filter parameters, each "key=value", into a filter. A key given twice with
// different values can match nothing and is refused, as is a filter outside the protocol's limits.
func parseFilter(params []string) (map[string]string, error) {
	if len(params) == 0 {
		return nil, nil
	}
	f := make(map[string]string, len(params))
	for _, p := range params {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, badRequest("filter %q: want key=value", p)
		}
		if old, dup := f[k]; dup && old != v {
			return nil, badRequest("filter: key %q given twice (%q and %q)", k, old, v)
		}
		f[k] = v
	}
	if err := subjects.ValidateMetadata(f, subjects.MaxMetadataPairs); err != nil {
		var e *subjects.Error
		if errors.As(err, &e) {
			return nil, &inputError{status: http.StatusBadRequest, code: e.Code, msg: "filter: " + e.Message}
		}
		return nil, badRequest("filter: %v", err)
	}
	return f, nil
}

// parseState returns the state parameter, pending when absent.
func parseState(s string) (subjects.State, error) {
	if s == "" {
		return subjects.StatePending, nil
	}
	if !slices.Contains(subjects.States, subjects.State(s)) {
		return "", badRequest("state %q: want one of %v", s, subjects.States)
	}
	return subjects.State(s), nil
}

// parseLimit returns the limit parameter: def when absent, 1 to most when given.
func parseLimit(s string, def, most int) (int, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, badRequest("limit %q: not an integer", s)
	}
	if n < 1 || n > most {
		return 0, &inputError{status: http.StatusBadRequest, code: subjects.CodeOutOfRange, msg: fmt.Sprintf("limit %d: want 1 to %d", n, most)}
	}
	return n, nil
}
