package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// previewRunes is how much of a payload or of the metadata a table shows.
const previewRunes = 40

// writeJSON writes v as one indented JSON document.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// newTable returns the tabwriter of every table; Flush it.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// fmtDuration prints d without the zero units Go's String leaves at the end: 24h, 1m30s, 500ms.
func fmtDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// fmtMS prints a duration in milliseconds of the wire.
func fmtMS(ms int64) string { return fmtDuration(time.Duration(ms) * time.Millisecond) }

// fmtTime prints t in RFC 3339, UTC, to the millisecond as natstone keeps times, always with three
// digits of the fraction so that a column of times lines up and sorts as text; "-" for the zero
// time.
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// fmtExpires prints the time left until a lease ends: "29.5s", "expired", "-" without a lease.
func fmtExpires(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	left := t.Sub(now)
	if left <= 0 {
		return "expired"
	}
	return fmtDuration(left.Round(time.Second / 10))
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// plural is one if n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// printable replaces what would break a table cell or a terminal (control characters, invalid or
// unprintable runes) with '.', and cuts s to limit runes with "…" (limit 0: no cut).
func printable(s string, limit int) string {
	var b strings.Builder
	n := 0
	for _, r := range s {
		if limit > 0 && n == limit {
			b.WriteString("…")
			break
		}
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			r = '.'
		}
		b.WriteRune(r)
		n++
	}
	return b.String()
}

// payloadPreview is a payload's table cell: "-" when the reply had none, the text cut to limit
// runes, or its size when it is not UTF-8.
func payloadPreview(p []byte, limit int) string {
	switch {
	case p == nil:
		return "-"
	case len(p) == 0:
		return `""`
	case !utf8.Valid(p):
		return fmt.Sprintf("(%d bytes, binary)", len(p))
	}
	return printable(string(p), limit)
}

// fmtPairs prints metadata as sorted k=v pairs separated by sep, "-" for none.
func fmtPairs(md map[string]string, sep string) string {
	if len(md) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(md))
	for _, k := range slices.Sorted(maps.Keys(md)) {
		parts = append(parts, k+"="+md[k])
	}
	return strings.Join(parts, sep)
}

// fmtAttempts prints "attempts/max".
func fmtAttempts(m *workers.Message) string {
	return strconv.Itoa(m.Attempts) + "/" + strconv.Itoa(m.Attempts+m.AttemptsLeft)
}

// wireMessage converts a Client message back to its protocol form, for --json: the payload as text
// when it is UTF-8, else base64; no payload when the reply had none.
func wireMessage(m *workers.Message) subjects.Message {
	w := subjects.Message{
		ID:           m.ID,
		Queue:        m.Queue,
		State:        m.State,
		Priority:     m.Priority,
		Metadata:     m.Metadata,
		Version:      m.Version,
		Attempts:     m.Attempts,
		AttemptsLeft: m.AttemptsLeft,
		LeaseID:      m.LeaseID,
		EnqueuedAt:   m.EnqueuedAt,
		VisibleAt:    m.VisibleAt,
		UpdatedAt:    m.UpdatedAt,
	}
	if m.Payload != nil {
		w.SetPayload(m.Payload) // the form the broker's reply had
	}
	if !m.LeaseExpiresAt.IsZero() {
		t := m.LeaseExpiresAt
		w.LeaseExpiresAt = &t
	}
	if !m.EndedAt.IsZero() {
		t := m.EndedAt
		w.EndedAt = &t
	}
	return w
}

// wireMessages converts for the {"messages": […]} document of dequeue.
func wireMessages(msgs []workers.Message) subjects.DequeueReply {
	r := subjects.DequeueReply{Messages: make([]subjects.Message, len(msgs))}
	for i := range msgs {
		r.Messages[i] = wireMessage(&msgs[i])
	}
	return r
}

// printMessages prints messages as a table, one row each, with a preview of their payloads when
// payloads is set (a dequeue's; a settle's reply has none).
func printMessages(w io.Writer, msgs []workers.Message, now time.Time, payloads bool) {
	tw := newTable(w)
	head := "ID\tSTATE\tPRIORITY\tATTEMPTS\tLEASE\tEXPIRES\tMETADATA"
	if payloads {
		head += "\tPAYLOAD"
	}
	fmt.Fprintln(tw, head)
	for i := range msgs {
		m := &msgs[i]
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s",
			printable(m.ID, 0), m.State, m.Priority, fmtAttempts(m), orDash(m.LeaseID),
			fmtExpires(m.LeaseExpiresAt, now), printable(fmtPairs(m.Metadata, ","), previewRunes))
		if payloads {
			fmt.Fprintf(tw, "\t%s", payloadPreview(m.Payload, previewRunes))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// printMessage prints one message in full, the payload last as it is.
func printMessage(w io.Writer, m *workers.Message, now time.Time) {
	tw := newTable(w)
	fmt.Fprintf(tw, "ID:\t%s\n", printable(m.ID, 0))
	fmt.Fprintf(tw, "Queue:\t%s\n", m.Queue)
	fmt.Fprintf(tw, "State:\t%s\n", m.State)
	fmt.Fprintf(tw, "Priority:\t%d\n", m.Priority)
	fmt.Fprintf(tw, "Metadata:\t%s\n", printable(fmtPairs(m.Metadata, " "), 0))
	fmt.Fprintf(tw, "Attempts:\t%d of %d\n", m.Attempts, m.Attempts+m.AttemptsLeft)
	switch {
	case m.LeaseID == "":
	case m.LeaseExpiresAt.IsZero(): // not running: the lease it last ran under, ended
		fmt.Fprintf(tw, "Last lease:\t%s\n", m.LeaseID)
	default:
		fmt.Fprintf(tw, "Lease:\t%s\n", m.LeaseID)
		fmt.Fprintf(tw, "Lease expires:\t%s (%s left)\n", fmtTime(m.LeaseExpiresAt), fmtExpires(m.LeaseExpiresAt, now))
	}
	fmt.Fprintf(tw, "Version:\t%d\n", m.Version)
	fmt.Fprintf(tw, "Enqueued:\t%s\n", fmtTime(m.EnqueuedAt))
	fmt.Fprintf(tw, "Visible:\t%s\n", fmtTime(m.VisibleAt))
	fmt.Fprintf(tw, "Updated:\t%s\n", fmtTime(m.UpdatedAt))
	if !m.EndedAt.IsZero() {
		fmt.Fprintf(tw, "Ended:\t%s\n", fmtTime(m.EndedAt))
	}
	switch {
	case m.Payload == nil:
	case !utf8.Valid(m.Payload):
		fmt.Fprintf(tw, "Payload:\t%d bytes, not UTF-8 (--json shows it in base64)\n", len(m.Payload))
	default:
		fmt.Fprintf(tw, "Payload:\t%d bytes\n", len(m.Payload))
	}
	tw.Flush()
	if m.Payload != nil && utf8.Valid(m.Payload) && len(m.Payload) > 0 {
		// As it is, but without control characters a terminal would act on.
		text := strings.Map(func(r rune) rune {
			if r == '\n' || r == '\t' || unicode.IsPrint(r) {
				return r
			}
			return '.'
		}, string(m.Payload))
		fmt.Fprintln(w, text)
	}
}

// printQueues prints the queue table.
func printQueues(w io.Writer, queues []subjects.QueueInfo) {
	tw := newTable(w)
	fmt.Fprintln(tw, "NAME\tTYPE\tPENDING\tRUNNING\tINVISIBLE\tCOMPLETED\tCANCELED\tERRORED")
	for _, q := range queues {
		c := q.Counts
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n",
			q.Name, q.Config.Type, c.Pending, c.Running, c.Invisible, c.Completed, c.Canceled, c.Errored)
	}
	tw.Flush()
}

// printQueue prints one queue: its config, revision and counts.
func printQueue(w io.Writer, q *subjects.QueueInfo) {
	cfg, c := &q.Config, &q.Counts
	tw := newTable(w)
	fmt.Fprintf(tw, "Name:\t%s\n", q.Name)
	fmt.Fprintf(tw, "Type:\t%s\n", cfg.Type)
	if cfg.ExclusivityKey != "" {
		fmt.Fprintf(tw, "Exclusivity key:\t%s\n", cfg.ExclusivityKey)
		fmt.Fprintf(tw, "Running per value:\t%d at most\n", max(cfg.MaxRunningPerValue, 1))
	}
	fmt.Fprintf(tw, "Default lease:\t%s\n", fmtMS(cfg.LeaseMS))
	fmt.Fprintf(tw, "Default invisible:\t%s\n", fmtMS(cfg.InvisibleMS))
	fmt.Fprintf(tw, "Max attempts:\t%d\n", cfg.MaxAttempts)
	fmt.Fprintf(tw, "Retention:\t%s\n", fmtMS(cfg.RetentionMS))
	fmt.Fprintf(tw, "Max payload:\t%d bytes\n", cfg.MaxPayloadBytes)
	fmt.Fprintf(tw, "Max metadata:\t%d pairs\n", cfg.MaxMetadataPairs)
	if cfg.MaxRunning > 0 {
		fmt.Fprintf(tw, "Max running:\t%d\n", cfg.MaxRunning)
	} else {
		fmt.Fprintf(tw, "Max running:\tno limit\n")
	}
	fmt.Fprintf(tw, "Enqueue blocked:\t%s\n", yesNo(cfg.EnqueueBlocked))
	fmt.Fprintf(tw, "Dequeue blocked:\t%s\n", yesNo(cfg.DequeueBlocked))
	fmt.Fprintf(tw, "Revision:\t%d\n", q.Revision)
	fmt.Fprintf(tw, "Created:\t%s\n", fmtTime(q.CreatedAt))
	fmt.Fprintf(tw, "Messages:\tpending %d, running %d, invisible %d, completed %d, canceled %d, errored %d\n",
		c.Pending, c.Running, c.Invisible, c.Completed, c.Canceled, c.Errored)
	tw.Flush()
}

// printDepth prints the counts of depth as a one-row table.
func printDepth(w io.Writer, queue string, c subjects.Counts) {
	tw := newTable(w)
	fmt.Fprintln(tw, "QUEUE\tPENDING\tRUNNING\tINVISIBLE\tCOMPLETED\tCANCELED\tERRORED")
	fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\n", queue, c.Pending, c.Running, c.Invisible, c.Completed, c.Canceled, c.Errored)
	tw.Flush()
}

// printRescheduled prints a rescheduled message: its place in the queue and when it runs.
func printRescheduled(w io.Writer, m *workers.Message) {
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tSTATE\tPRIORITY\tVISIBLE_AT\tVERSION")
	fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\n", printable(m.ID, 0), m.State, m.Priority, fmtTime(m.VisibleAt), m.Version)
	tw.Flush()
}

// printEnqueued prints enqueue replies as a table.
func printEnqueued(w io.Writer, replies []subjects.EnqueueReply) {
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tSTATE\tPRIORITY\tVISIBLE_AT\tDUPLICATE")
	for _, r := range replies {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", printable(r.ID, 0), r.State, r.Priority, fmtTime(r.VisibleAt), yesNo(r.Duplicate))
	}
	tw.Flush()
}
