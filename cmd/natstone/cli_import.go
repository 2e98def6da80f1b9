package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// How an import sends its lines.
const (
	// importInFlight is how many enqueue_batch requests an import has outstanding at once, unless
	// --in-flight says otherwise.
	importInFlight = 4
	// maxInFlight bounds --in-flight.
	maxInFlight = 64
	// importLineOverhead bounds what the request adds to a line's own size: the payload in base64
	// (the Client always sends payload_base64) is counted separately.
	importLineOverhead = 64
	// importEnvelope is room left in a request for {"messages":[…]}.
	importEnvelope = 1024
	// progressInterval is how often the progress line is redrawn.
	progressInterval = 200 * time.Millisecond
)

// codeBadLine is the code of an import line that is not an enqueue body.
const codeBadLine = "bad_line"

// importLine is a line of an import parsed into a message.
type importLine struct {
	n    int // line number, from 1
	msg  workers.BatchMessage
	size int // bytes it takes in the request, about
}

// importFailure is a line that was not imported.
type importFailure struct {
	Line  int    `json:"line"`
	Code  string `json:"code"`  // the broker's error code, or "bad_line" for a line that is no message
	Error string `json:"error"` // the broker's message, or what is wrong with the line
}

// importSummary is the result of an import, also its --json document.
type importSummary struct {
	Queue          string          `json:"queue"`
	Lines          int             `json:"lines"`      // messages read: lines that are not blank
	Enqueued       int             `json:"enqueued"`   // new messages written
	Duplicates     int             `json:"duplicates"` // lines whose id existed: nothing written
	DuplicateLines []int           `json:"duplicate_lines"`
	Failed         []importFailure `json:"failed"`
	// Stopped is the error that stopped the import; the lines counted in Unconfirmed (from line
	// FirstUnconfirmed on, not necessarily all of them) then have an unknown outcome or were
	// never sent, and the rest of the input was not read.
	Stopped          string `json:"stopped,omitempty"`
	Unconfirmed      int    `json:"unconfirmed,omitempty"`
	FirstUnconfirmed int    `json:"first_unconfirmed_line,omitempty"`
}

// lineOutcome is what happened to one line that was sent.
type lineOutcome struct {
	reply subjects.EnqueueReply
	err   error // the broker refused this message
}

// flight is one batch on its way: done is closed when outcomes (for a prefix of lines) and fatal
// are set.
type flight struct {
	lines    []importLine
	outcomes []lineOutcome
	fatal    error // lines[len(outcomes):] have no known outcome
	done     chan struct{}
}

// importer runs one import.
type importer struct {
	client   *workers.Client
	queue    string
	inFlight int // batches sent at once
	maxBytes int // of one request
	progress *importProgress
	sum      importSummary
	fatal    error
	held     *importLine    // read but did not fit in the last batch
	sending  map[string]int // the ids in the batches in flight, with their counts
	unread   bool           // the import stopped before the input's end
}

// runImport is "enqueue QUEUE --import FILE".
func runImport(ctx context.Context, c *clientCommand, queue, path string, inFlight int) int {
	in := io.Reader(os.Stdin)
	total := 0 // lines; 0: unknown
	tty := false
	if f, ok := c.stderr.(*os.File); ok && isTerminal(f) {
		tty = true
	}
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return c.fail(fmt.Errorf("import: %w", err), nil)
		}
		defer f.Close()
		in = f
		if tty && rereadable(f) {
			if total, err = countLines(path); err != nil {
				return c.fail(fmt.Errorf("import: %w", err), nil)
			}
		}
	}
	return c.run(ctx, func(ctx context.Context, conn *cliConn) error {
		im := &importer{
			client:   conn.client,
			queue:    queue,
			inFlight: inFlight,
			maxBytes: int(conn.nc.MaxPayload()) - importEnvelope,
			sending:  map[string]int{},
			sum:      importSummary{Queue: queue, DuplicateLines: []int{}, Failed: []importFailure{}},
		}
		if tty {
			im.progress = startProgress(c.stderr, total)
		}
		im.run(ctx, in)
		if im.progress != nil {
			im.progress.end()
		}
		if err := c.output(im.sum, func(w io.Writer) { im.print(w, c.stderr) }); err != nil {
			return err
		}
		if im.fatal != nil {
			return im.fatal
		}
		if len(im.sum.Failed) > 0 {
			return fmt.Errorf("natstone: import: %d of %d lines failed", len(im.sum.Failed), im.sum.Lines)
		}
		return nil
	})
}

// run reads in to its end (or to a fatal error) and sends its lines, inFlight batches at a time,
// collecting the outcomes in order.
//
// A batch that repeats an id of a batch in flight waits for it, so that the first line with an id
// is the one written and the later ones are its duplicates, as in a sequential import. Messages
// without a priority get the time the broker enqueues them (plus any invisibility), so across
// batches in flight their order may differ from the file's; with inFlight 1 it is the file's.
func (im *importer) run(ctx context.Context, in io.Reader) {
	r := bufio.NewReaderSize(in, 1<<20)
	var (
		pending []*flight
		lineNo  int
		readErr error
	)
	for im.fatal == nil && readErr == nil {
		var batch []importLine
		batch, lineNo, readErr = im.nextBatch(r, lineNo)
		if len(batch) == 0 {
			continue
		}
		for len(pending) > 0 && (len(pending) >= im.inFlight || im.repeats(batch)) {
			im.collect(pending[0])
			pending = pending[1:]
		}
		if im.fatal != nil {
			im.unconfirmed(batch) // read, never sent
			break
		}
		pending = append(pending, im.launch(ctx, batch))
	}
	if im.held != nil {
		im.unconfirmed([]importLine{*im.held})
	}
	for _, f := range pending {
		im.collect(f)
	}
	im.unread = im.fatal != nil && readErr == nil
	if readErr != nil && !errors.Is(readErr, io.EOF) && im.fatal == nil {
		im.fatal = fmt.Errorf("import: reading line %d: %w", lineNo+1, readErr)
		im.sum.Stopped = im.fatal.Error()
	}
	slices.SortFunc(im.sum.Failed, func(a, b importFailure) int { return cmp.Compare(a.Line, b.Line) })
}

// nextBatch reads lines until a batch is full (subjects.MaxEnqueueBatch messages, or maxBytes), or
// until the input has nothing more to read at once: a producer that writes to a pipe now and then
// has each line sent as it comes, not held until a thousand have. A line that is not a message is
// recorded as failed and skipped. It returns the batch, the number of the last line read, and
// io.EOF at the end of the input.
func (im *importer) nextBatch(r *bufio.Reader, lineNo int) ([]importLine, int, error) {
	var batch []importLine
	size := 0
	if im.held != nil {
		batch, size = append(batch, *im.held), im.held.size
		im.held = nil
	}
	for len(batch) < subjects.MaxEnqueueBatch {
		data, err := r.ReadBytes('\n')
		if len(data) > 0 {
			lineNo++
			if lineNo == 1 {
				data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) // a UTF-8 byte order mark
			}
			if line, ok := im.parse(lineNo, data); ok {
				if len(batch) > 0 && size+line.size > im.maxBytes {
					im.held = &line
					return batch, lineNo, nil
				}
				batch, size = append(batch, line), size+line.size
			}
		}
		if err != nil {
			return batch, lineNo, err
		}
		if len(batch) > 0 && r.Buffered() == 0 {
			return batch, lineNo, nil // the next read would wait for the producer
		}
	}
	return batch, lineNo, nil
}

// parse parses line n, recording it as failed if it is not a message. Blank lines are skipped.
func (im *importer) parse(n int, data []byte) (importLine, bool) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return importLine{}, false
	}
	im.sum.Lines++
	msg, err := parseImportLine(data)
	if err != nil {
		im.sum.Failed = append(im.sum.Failed, importFailure{Line: n, Code: codeBadLine, Error: err.Error()})
		return importLine{}, false
	}
	return importLine{n: n, msg: msg, size: len(data) + len(msg.Payload)/3 + importLineOverhead}, true
}

// parseImportLine decodes one line as the broker decodes an enqueue body (subjects.DecodeEnqueue):
// strictly, one object of valid UTF-8, no unknown field, at most one payload form, no empty id.
func parseImportLine(data []byte) (workers.BatchMessage, error) {
	if data[0] != '{' {
		return workers.BatchMessage{}, errors.New("not a JSON object")
	}
	r, err := subjects.DecodeEnqueue(data)
	if err != nil {
		var e *subjects.Error
		if errors.As(err, &e) {
			err = errors.New(strings.TrimPrefix(e.Message, "malformed JSON body: ")) // the line's fault, said once
		}
		return workers.BatchMessage{}, err
	}
	if r.Payload != "" && len(r.PayloadBase64) > 0 {
		return workers.BatchMessage{}, errors.New("give payload or payload_base64, not both")
	}
	m := workers.BatchMessage{
		Payload:     r.PayloadBase64,
		EnqueueOpts: workers.EnqueueOpts{ID: r.ID, Priority: r.Priority, Metadata: r.Metadata},
	}
	if r.Payload != "" {
		m.Payload = []byte(r.Payload)
	}
	// As the protocol has it: invisible_ms 0 is pending at once (the Client's negative Invisible),
	// lease_ms 0 the queue's lease (the Client's zero Lease).
	if m.Invisible, err = lineDuration("invisible_ms", r.InvisibleMS, 0); err != nil {
		return workers.BatchMessage{}, err
	}
	if r.InvisibleMS != nil && *r.InvisibleMS == 0 {
		m.Invisible = -1
	}
	if r.VisibleAt != nil {
		if r.InvisibleMS != nil {
			return workers.BatchMessage{}, errors.New("give invisible_ms or visible_at, not both")
		}
		m.VisibleAt = givenTime(*r.VisibleAt)
	}
	if m.Lease, err = lineDuration("lease_ms", r.LeaseMS, 0); err != nil {
		return workers.BatchMessage{}, err
	}
	if r.MaxAttempts != nil {
		// The Client's zero MaxAttempts is the queue's: a line's 0 is out of range, as the broker says.
		if n := *r.MaxAttempts; n < 1 || n > subjects.MaxAttemptsLimit {
			return workers.BatchMessage{}, fmt.Errorf("max_attempts must be 1 to %d, not %d", subjects.MaxAttemptsLimit, n)
		}
		m.MaxAttempts = int(*r.MaxAttempts)
	}
	return m, nil
}

// lineDuration converts a line's optional milliseconds, which must be at least minMS.
func lineDuration(field string, ms *int64, minMS int64) (time.Duration, error) {
	switch {
	case ms == nil:
		return 0, nil
	case *ms < minMS:
		return 0, fmt.Errorf("%s must be at least %d, not %d", field, minMS, *ms)
	case *ms > math.MaxInt64/int64(time.Millisecond):
		return 0, fmt.Errorf("%s %d is out of range", field, *ms)
	}
	return time.Duration(*ms) * time.Millisecond, nil
}

// repeats reports whether batch has an id of a batch in flight.
func (im *importer) repeats(batch []importLine) bool {
	for i := range batch {
		if id := batch[i].msg.ID; id != "" && im.sending[id] > 0 {
			return true
		}
	}
	return false
}

// launch sends batch in a goroutine of its own.
func (im *importer) launch(ctx context.Context, batch []importLine) *flight {
	for i := range batch {
		if id := batch[i].msg.ID; id != "" {
			im.sending[id]++
		}
	}
	f := &flight{lines: batch, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		f.outcomes, f.fatal = im.send(ctx, batch, make([]lineOutcome, 0, len(batch)))
	}()
	return f
}

// send enqueues lines in one batch. A batch is all or nothing, so when the broker refuses one of
// its messages send splits it in halves and sends each, down to the single messages it refuses.
// It returns the outcomes of a prefix of lines, and the error that stopped it before the others.
func (im *importer) send(ctx context.Context, lines []importLine, out []lineOutcome) ([]lineOutcome, error) {
	msgs := make([]workers.BatchMessage, len(lines))
	for i := range lines {
		msgs[i] = lines[i].msg
	}
	replies, err := im.client.EnqueueBatch(ctx, im.queue, msgs)
	switch {
	case err == nil && len(replies) != len(lines):
		return out, fmt.Errorf("natstone: import: %d replies to a batch of %d", len(replies), len(lines))
	case err == nil:
		for _, r := range replies {
			out = append(out, lineOutcome{reply: r})
		}
		return out, nil
	case !messageRefused(err):
		return out, err
	case len(lines) == 1:
		return append(out, lineOutcome{err: err}), nil
	}
	half := len(lines) / 2
	if out, err = im.send(ctx, lines[:half], out); err != nil {
		return out, err
	}
	return im.send(ctx, lines[half:], out)
}

// messageRefused reports whether err refuses a batch because of one of its messages (rather than
// the queue, the broker or the connection).
func messageRefused(err error) bool {
	var apiErr *workers.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.Code {
		case subjects.CodeBadRequest, subjects.CodeInvalidID, subjects.CodeInvalidMetadata,
			subjects.CodeMissingExclusivityKey, subjects.CodePayloadTooLarge, subjects.CodeOutOfRange:
			return true
		}
		return false
	}
	return errors.Is(err, nats.ErrMaxPayload) // one message larger than the server's max_payload
}

// collect waits for f and adds its outcomes to the summary.
func (im *importer) collect(f *flight) {
	<-f.done
	for i := range f.lines {
		if id := f.lines[i].msg.ID; id != "" {
			if im.sending[id]--; im.sending[id] == 0 {
				delete(im.sending, id)
			}
		}
	}
	for i, o := range f.outcomes {
		n := f.lines[i].n
		switch {
		case o.err != nil:
			failure := importFailure{Line: n, Code: codeBadLine, Error: o.err.Error()}
			var apiErr *workers.APIError
			if errors.As(o.err, &apiErr) {
				failure.Code, failure.Error = string(apiErr.Code), apiErr.Message
			}
			im.sum.Failed = append(im.sum.Failed, failure)
		case o.reply.Duplicate:
			im.sum.Duplicates++
			im.sum.DuplicateLines = append(im.sum.DuplicateLines, n)
		default:
			im.sum.Enqueued++
		}
	}
	if f.fatal != nil {
		if im.fatal == nil {
			im.fatal = f.fatal
			im.sum.Stopped = describeError(f.fatal, nil)
		}
		im.unconfirmed(f.lines[len(f.outcomes):])
	}
	if im.progress != nil {
		im.progress.done.Store(int64(f.lines[len(f.lines)-1].n))
	}
}

// unconfirmed counts lines whose outcome is unknown.
func (im *importer) unconfirmed(lines []importLine) {
	for _, l := range lines {
		im.sum.Unconfirmed++
		if im.sum.FirstUnconfirmed == 0 || l.n < im.sum.FirstUnconfirmed {
			im.sum.FirstUnconfirmed = l.n
		}
	}
}

// print writes the summary for people: counts on w, each failed line on errw.
func (im *importer) print(w, errw io.Writer) {
	for _, f := range im.sum.Failed {
		fmt.Fprintf(errw, "natstone: line %d: %s: %s\n", f.Line, f.Code, f.Error)
	}
	s := &im.sum
	tw := newTable(w)
	fmt.Fprintf(tw, "queue:\t%s\n", s.Queue)
	fmt.Fprintf(tw, "lines:\t%d (not counting blank ones)\n", s.Lines)
	fmt.Fprintf(tw, "enqueued:\t%d\n", s.Enqueued)
	if s.Duplicates > 0 {
		fmt.Fprintf(tw, "duplicates:\t%d (lines %s)\n", s.Duplicates, quoteLines(s.DuplicateLines, 10))
	} else {
		fmt.Fprintf(tw, "duplicates:\t0\n")
	}
	failed := make([]int, len(s.Failed))
	for i, f := range s.Failed {
		failed[i] = f.Line
	}
	if len(failed) > 0 {
		fmt.Fprintf(tw, "failed:\t%d (lines %s)\n", len(failed), quoteLines(failed, 10))
	} else {
		fmt.Fprintf(tw, "failed:\t0\n")
	}
	rest := ""
	if im.unread {
		rest = "; the rest of the input was not read"
	}
	switch {
	case s.Unconfirmed > 0:
		fmt.Fprintf(tw, "unconfirmed:\t%d (from line %d%s)\n", s.Unconfirmed, s.FirstUnconfirmed, rest)
	case s.Stopped != "" && im.unread:
		fmt.Fprintf(tw, "unconfirmed:\t0 (the rest of the input was not read)\n")
	case s.Stopped != "":
		fmt.Fprintf(tw, "unconfirmed:\t0\n")
	}
	tw.Flush()
}

// rereadable reports whether opening f's path again reads it from its start: a regular file, not a
// pipe, a FIFO or a process substitution (<(zcat x.gz)), which a second reader would drain. Only
// such a file is counted for the progress bar.
func rereadable(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode().IsRegular()
}

// countLines counts the lines of a file, a last one without a newline included.
func countLines(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	n, last := 0, byte('\n')
	for {
		k, err := f.Read(buf)
		if k > 0 {
			n += bytes.Count(buf[:k], []byte{'\n'})
			last = buf[k-1]
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if last != '\n' {
		n++
	}
	return n, nil
}

// importProgress redraws a progress line on a terminal while an import runs.
type importProgress struct {
	w     io.Writer
	total int64 // lines; 0: unknown
	start time.Time
	done  atomic.Int64 // lines with a known outcome

	stop     chan struct{}
	finished chan struct{}
	once     sync.Once
}

// startProgress starts redrawing on w every progressInterval until end.
func startProgress(w io.Writer, total int) *importProgress {
	p := &importProgress{w: w, total: int64(total), start: time.Now(),
		stop: make(chan struct{}), finished: make(chan struct{})}
	go func() {
		defer close(p.finished)
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				fmt.Fprint(p.w, "\r\033[K"+renderProgress(p.done.Load(), p.total, time.Since(p.start)))
			}
		}
	}()
	return p
}

// end stops the redrawing and clears the line.
func (p *importProgress) end() {
	p.once.Do(func() {
		close(p.stop)
		<-p.finished
		fmt.Fprint(p.w, "\r\033[K")
	})
}

// progressBarWidth is the width of the bar between its brackets.
const progressBarWidth = 30

// renderProgress is the progress line: a bar with done/total lines when the total is known, and
// the rate.
func renderProgress(done, total int64, elapsed time.Duration) string {
	rate := 0.0
	if elapsed > 0 {
		rate = float64(done) / elapsed.Seconds()
	}
	if total <= 0 {
		return fmt.Sprintf("importing: %d lines  %.0f lines/s", done, rate)
	}
	done = min(done, total)
	filled := int(done * progressBarWidth / total)
	bar := strings.Repeat("=", filled)
	if filled < progressBarWidth {
		bar += ">" + strings.Repeat(" ", progressBarWidth-filled-1)
	}
	return fmt.Sprintf("importing: [%s] %d/%d lines %3d%%  %.0f lines/s", bar, done, total, done*100/total, rate)
}
