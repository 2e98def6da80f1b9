package subjects_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"testing"

	"github.com/natstone/natstone/subjects"
)

// allCodes is every Code constant with its documented text and status.
var allCodes = []struct {
	code   subjects.Code
	text   string
	status int
}{
	{subjects.CodeBadRequest, "bad_request", 400},
	{subjects.CodeInvalidQueueName, "invalid_queue_name", 400},
	{subjects.CodeInvalidID, "invalid_id", 400},
	{subjects.CodeInvalidMetadata, "invalid_metadata", 400},
	{subjects.CodeInvalidConfig, "invalid_config", 400},
	{subjects.CodeMissingExclusivityKey, "missing_exclusivity_key", 400},
	{subjects.CodePayloadTooLarge, "payload_too_large", 413},
	{subjects.CodeOutOfRange, "out_of_range", 400},
	{subjects.CodeQueueNotFound, "queue_not_found", 404},
	{subjects.CodeQueueExists, "queue_exists", 409},
	{subjects.CodeQueueBlocked, "queue_blocked", 409},
	{subjects.CodeMessageNotFound, "message_not_found", 404},
	{subjects.CodeInvalidState, "invalid_state", 409},
	{subjects.CodeLeaseMismatch, "lease_mismatch", 409},
	{subjects.CodeLeaseExpired, "lease_expired", 409},
	{subjects.CodeRevisionMismatch, "revision_mismatch", 409},
	{subjects.CodeUnavailable, "unavailable", 503},
	{subjects.CodeInternal, "internal", 500},
}

func TestCodeTextAndStatus(t *testing.T) {
	seen := map[subjects.Code]bool{}
	for _, tc := range allCodes {
		if string(tc.code) != tc.text {
			t.Errorf("code %q, want text %q (codes are a stable contract)", tc.code, tc.text)
		}
		if seen[tc.code] {
			t.Errorf("code %q listed twice", tc.code)
		}
		seen[tc.code] = true
		if got := tc.code.Status(); got != tc.status {
			t.Errorf("%q.Status() = %d, want %d", tc.code, got, tc.status)
		}
	}
	// Codes outside the contract are client errors.
	for _, c := range []subjects.Code{"", "nope", "BAD_REQUEST"} {
		if got := c.Status(); got != 400 {
			t.Errorf("Code(%q).Status() = %d, want 400", c, got)
		}
	}
}

func TestErrorf(t *testing.T) {
	err := subjects.Errorf(subjects.CodeOutOfRange, "batch %d over %d", 300, subjects.MaxDequeueBatch)
	if err.Code != subjects.CodeOutOfRange || err.Message != "batch 300 over 256" {
		t.Fatalf("Errorf = %#v", err)
	}
	if got, want := err.Error(), "natstone: out_of_range: batch 300 over 256"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	// No args: the format is still a format.
	if got := subjects.Errorf(subjects.CodeInternal, "100%% sure").Message; got != "100% sure" {
		t.Fatalf("Errorf without args: Message = %q", got)
	}
}

func TestErrorIs(t *testing.T) {
	for _, a := range allCodes {
		err := subjects.Errorf(a.code, "something about %s", a.text)
		for _, b := range allCodes {
			target := &subjects.Error{Code: b.code}
			if got := errors.Is(err, target); got != (a.code == b.code) {
				t.Errorf("errors.Is(%v, &Error{Code: %q}) = %v", err, b.code, got)
			}
		}
	}
	// The message does not matter, either side.
	err := subjects.Errorf(subjects.CodeLeaseExpired, "lease L1 of m1 expired")
	if !errors.Is(err, &subjects.Error{Code: subjects.CodeLeaseExpired, Message: "other text"}) {
		t.Error("errors.Is ignores the message: want a match for a different message")
	}
	// Not a *subjects.Error: no match, no panic.
	if errors.Is(err, io.EOF) {
		t.Error("errors.Is(err, io.EOF) = true")
	}
	if plain := fmt.Errorf("plain: %w", io.EOF); errors.Is(plain, &subjects.Error{Code: subjects.CodeInternal}) {
		t.Error("a plain error matches &Error{Code: internal}")
	}
}

func TestErrorWrapped(t *testing.T) {
	base := subjects.Errorf(subjects.CodeQueueNotFound, "queue %q", "encode")
	wrapped := fmt.Errorf("enqueue: %w", base)
	twice := fmt.Errorf("client: %w", wrapped)
	joined := errors.Join(io.EOF, twice)
	for _, err := range []error{base, wrapped, twice, joined} {
		if !errors.Is(err, &subjects.Error{Code: subjects.CodeQueueNotFound}) {
			t.Errorf("errors.Is(%v, queue_not_found) = false", err)
		}
		if errors.Is(err, &subjects.Error{Code: subjects.CodeMessageNotFound}) {
			t.Errorf("errors.Is(%v, message_not_found) = true", err)
		}
		if got := subjects.CodeOf(err); got != subjects.CodeQueueNotFound {
			t.Errorf("CodeOf(%v) = %q, want queue_not_found", err, got)
		}
		var e *subjects.Error
		if !errors.As(err, &e) || e != base {
			t.Errorf("errors.As(%v) = %v, want the original *Error", err, e)
		}
	}
	// %v (not %w) loses the chain.
	if got := subjects.CodeOf(fmt.Errorf("x: %v", base)); got != subjects.CodeInternal { //nolint:errorlint // %v on purpose
		t.Errorf("CodeOf of a %%v-formatted error = %q, want internal", got)
	}
}

func TestCodeOfNonProtocolErrors(t *testing.T) {
	for _, err := range []error{
		nil,
		io.EOF,
		errors.New("boom"),
		fmt.Errorf("wrapped: %w", io.ErrUnexpectedEOF),
	} {
		if got := subjects.CodeOf(err); got != subjects.CodeInternal {
			t.Errorf("CodeOf(%v) = %q, want internal", err, got)
		}
	}
	// NewSpace's error is a configuration error, not a protocol *Error.
	_, err := subjects.NewSpace("a..b")
	if got := subjects.CodeOf(err); got != subjects.CodeInternal {
		t.Errorf("CodeOf(NewSpace error) = %q, want internal", got)
	}
}

// TestTypedNilError covers a typed nil *Error on either side of errors.Is and in CodeOf, which a
// caller gets from a function declared to return *Error that is assigned to an error variable.
func TestTypedNilError(t *testing.T) {
	err := subjects.Errorf(subjects.CodeInternal, "x")
	var nilErr *subjects.Error
	var panicked []string
	func() {
		defer func() {
			if r := recover(); r != nil {
				panicked = append(panicked, fmt.Sprintf("errors.Is(err, (*Error)(nil)) panics: %v", r))
			}
		}()
		if errors.Is(err, nilErr) {
			t.Error("errors.Is(err, (*Error)(nil)) = true")
		}
	}()
	func() {
		defer func() {
			if r := recover(); r != nil {
				panicked = append(panicked, fmt.Sprintf("CodeOf(error((*Error)(nil))) panics: %v", r))
			}
		}()
		_ = subjects.CodeOf(error(nilErr))
	}()
	if len(panicked) > 0 {
		t.Fatalf("a typed nil *Error must not panic: %q", panicked)
	}
}

func TestErrorReplyJSON(t *testing.T) {
	in := subjects.ErrorReply{Error: subjects.Errorf(subjects.CodeLeaseMismatch, "lease %s is not current", "L2")}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"error":{"code":"lease_mismatch","message":"lease L2 is not current"}}`
	if string(b) != want {
		t.Fatalf("json.Marshal(ErrorReply) = %s, want %s", b, want)
	}
	var out subjects.ErrorReply
	if err := subjects.Decode(b, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, in) {
		t.Fatalf("round trip = %#v, want %#v", out.Error, in.Error)
	}
	if !errors.Is(out.Error, &subjects.Error{Code: subjects.CodeLeaseMismatch}) {
		t.Fatal("decoded error does not match its code")
	}
}
