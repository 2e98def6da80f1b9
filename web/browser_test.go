package web_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// defaultChromium is where Debian's chromium package installs the browser.
const defaultChromium = "/usr/bin/chromium"

// browserTimeout bounds each step of the browser test.
const browserTimeout = 15 * time.Second

// TestDashboard drives the dashboard in a real headless Chromium against a queue in a known state:
// the queues table, the queue page (counts, pending messages, a filter, expiring leases, the
// dequeue-blocked switch, a state tab) and a message page (fields, payload, history timeline). With
// NATSTONE_SCREENSHOT_DIR set it saves a full-page PNG of each page there.
func TestDashboard(t *testing.T) {
	t.Parallel()
	e := setup(t)
	b := startBrowser(t)
	shots := os.Getenv("NATSTONE_SCREENSHOT_DIR")

	// A queue in a known state: order-1 was released once then completed, order-2 is running,
	// order-3 and order-4 are pending, order-5 was canceled by an operator.
	base := time.Now().Add(time.Hour).Truncate(time.Minute).UnixMilli()
	e.createQueue("orders", &workers.QueueOpts{Lease: 20 * time.Second, MaxAttempts: 3})
	for i, md := range []map[string]string{
		{"kind": "a", "region": "eu"}, {"kind": "b", "region": "us"}, {"kind": "a", "region": "us"},
		{"kind": "b", "region": "eu"}, {"kind": "a", "region": "eu"},
	} {
		e.enqueue("orders", fmt.Sprintf("order-%d", i+1), base+int64(i)*60_000, fmt.Sprintf(`{"order": %d, "sku": "A-10%d"}`, i+1, i), md)
	}
	first := e.dequeue("orders", 2, "worker-a") // order-1 and order-2
	if _, err := e.c.Release(ctx(t), "orders", first[0].ID, first[0].LeaseID, &workers.ReleaseOpts{Error: "upstream said 429 <b>"}); err != nil {
		t.Fatal(err)
	}
	again := e.dequeue("orders", 1, "worker-b")[0] // order-1 again
	if _, err := e.c.Complete(ctx(t), "orders", again.ID, again.LeaseID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Cancel(ctx(t), "orders", "order-5", ""); err != nil {
		t.Fatal(err)
	}
	running := first[1]
	// Two more queues, so that the table has rows to tell apart.
	e.createQueue("reports", &workers.QueueOpts{Type: subjects.Exclusive, ExclusivityKey: "tenant", EnqueueBlocked: true})
	e.enqueue("mail", "mail-1", base, "hi", map[string]string{"to": "ann"})

	// The queues page: every count of every queue as the broker states it.
	b.do(chromedp.Navigate(e.http.URL + "/#/"))
	b.waitLoaded(`[data-view="queues"]`)
	for _, q := range []string{"orders", "reports", "mail"} {
		got := evaluate[map[string]int](b, fmt.Sprintf(
			`Object.fromEntries([...document.querySelectorAll('td[data-queue=%q][data-state]')].map(td => [td.dataset.state, Number(td.textContent)]))`, q))
		if want := countsMap(e.stats(q, nil).Counts); !maps.Equal(got, want) {
			t.Errorf("queues page, %s: counts %v, stats say %v", q, got, want)
		}
	}
	if want := countsMap(subjects.Counts{Pending: 2, Running: 1, Completed: 1, Canceled: 1}); !maps.Equal(evaluate[map[string]int](b,
		`Object.fromEntries([...document.querySelectorAll('td[data-queue="orders"][data-state]')].map(td => [td.dataset.state, Number(td.textContent)]))`), want) {
		t.Errorf("queues page: orders does not show %v", want)
	}
	if badges := evaluate[[]string](b, `[...document.querySelectorAll('tr[data-queue="reports"] [data-blocked]')].map(b => b.dataset.blocked)`); !slices.Equal(badges, []string{"enqueue"}) {
		t.Errorf("queues page: reports has blocked badges %v, want [enqueue]", badges)
	}
	// The page refreshes itself: a new message shows up without a reload.
	e.enqueue("mail", "mail-2", base+1, "hello", map[string]string{"to": "bob"})
	b.poll(`document.querySelector('td[data-queue="mail"][data-state="pending"]').textContent === "2"`)
	b.noError()
	b.screenshot(shots, "dashboard-queues.png")
	// In pages (of 100 by default): each after the last queue of the one before.
	b.do(chromedp.Navigate(e.http.URL + "/#/queues?limit=2"))
	b.waitLoaded(`[data-view="queues"]`)
	queueRows := `[...document.querySelectorAll('#queues tbody tr')].map(r => r.dataset.queue)`
	if got := evaluate[[]string](b, queueRows); !slices.Equal(got, []string{"mail", "orders"}) || evaluate[bool](b, `document.querySelector('#queues-first') !== null`) {
		t.Errorf("queues page of 2: %v, want mail and orders, and no link to the first page", got)
	}
	b.click(`#queues-next`)
	b.poll(`document.querySelector('#queues tbody tr[data-queue="reports"]') !== null`)
	if got := evaluate[[]string](b, queueRows); !slices.Equal(got, []string{"reports"}) || evaluate[bool](b, `document.querySelector('#queues-next') !== null`) {
		t.Errorf("the next page: %v, want reports alone, and no next link", got)
	}
	b.click(`#queues-first`)
	b.poll(`document.querySelector('#queues tbody tr[data-queue="mail"]') !== null`)
	b.noError()

	// The queue page, reached by its link: counts, the pending messages in EDF order, the lease
	// about to expire.
	b.click(`tr[data-queue="orders"] a`)
	b.waitLoaded(`[data-view="queue"][data-queue="orders"][data-state="pending"][data-filter=""]`)
	st := e.stats("orders", nil)
	if got := evaluate[map[string]int](b, `Object.fromEntries([...document.querySelectorAll('#counts [data-count]')].map(e => [e.dataset.count, Number(e.textContent)]))`); !maps.Equal(got, countsMap(st.Counts)) {
		t.Errorf("queue page: counts %v, stats say %+v", got, st.Counts)
	}
	if got, want := b.rows("#messages"), e.browse("orders", subjects.StatePending, nil); !slices.Equal(got, want) || len(want) != 2 {
		t.Errorf("queue page: pending %v, browse says %v", got, want)
	}
	if got := b.rows("#expiring"); !slices.Equal(got, []string{running.ID}) {
		t.Errorf("queue page: expiring leases of %v, want %s's", got, running.ID)
	}
	// A schedule set meanwhile shows up at the next refresh, with its cron, next fire and overlap.
	if evaluate[bool](b, `!document.querySelector('#schedules-section').hidden`) {
		t.Errorf("queue page: a schedules section for a queue without schedules")
	}
	if _, err := e.c.Schedule(ctx(t), "orders", "nightly", workers.ScheduleOpts{Cron: "0 2 * * *", Overlap: subjects.OverlapSkip}); err != nil {
		t.Fatal(err)
	}
	b.poll(`!document.querySelector('#schedules-section').hidden && document.querySelector('tr[data-schedule="nightly"] code').textContent === "0 2 * * *" &&
		document.querySelector('tr[data-schedule="nightly"] .schedule-overlap').textContent === "skip"`)

	// The dequeue-blocked switch changes the queue, at the second click: the first only arms its
	// Confirm button.
	b.click(`#toggle-dequeue-blocked`)
	b.poll(`!document.querySelector('#toggle-dequeue-blocked-confirm').hidden && !document.querySelector('#toggle-dequeue-blocked').checked`)
	if info, err := e.c.Queue(ctx(t), "orders"); err != nil || info.Config.DequeueBlocked {
		t.Errorf("after the first click on the dequeue switch: %+v, %v; want dequeues not blocked yet", info.Config, err)
	}
	b.click(`#toggle-dequeue-blocked-confirm`)
	waitFor(t, "dequeue_blocked to be set", func() bool {
		info, err := e.c.Queue(ctx(t), "orders")
		return err == nil && info.Config.DequeueBlocked && !info.Config.EnqueueBlocked
	})
	b.poll(`document.querySelector('#badges [data-blocked="dequeue"]') !== null && document.querySelector('#toggle-dequeue-blocked').checked`)
	if _, err := e.c.Dequeue(ctx(t), "orders", nil); !errors.Is(err, workers.ErrQueueBlocked) {
		t.Errorf("dequeue after the switch: %v, want ErrQueueBlocked", err)
	}
	b.noError()
	b.screenshot(shots, "dashboard-queue.png")

	// The filter box's text: pairs split at commas, a backslash taking the next character as is.
	for text, want := range map[string][]string{
		`kind=a`:               {"kind=a"},
		` kind=a , team=b, `:   {"kind=a", "team=b"},
		`path=a\,b, kind=c`:    {"path=a,b", "kind=c"},
		`note=back\\slash,x=y`: {`note=back\slash`, "x=y"},
		`k=trailing\`:          {`k=trailing\`},
		`sp= v\ , x=y`:         {"sp= v ", "x=y"}, // white space at a pair's end kept only escaped
		`\ k=v`:                {" k=v"},
	} {
		js, _ := json.Marshal(text)
		if got := evaluate[[]string](b, "parseFilter("+string(js)+")"); !slices.Equal(got, want) {
			t.Errorf("parseFilter(%s) = %q, want %q", js, got, want)
		}
		// The address the Filter button makes holds the pairs escaped as the box writes them:
		// read back, they are the same pairs (a comma in a value once split it in two).
		if got := evaluate[[]string](b, "parseFilter(parseFilter("+string(js)+").map(escapePair).join(','))"); !slices.Equal(got, want) {
			t.Errorf("the pairs of %s, escaped and read back: %q, want %q", js, got, want)
		}
	}

	// A filter narrows the list to the matching messages.
	b.do(chromedp.SendKeys(chromedp.CSS(`#filter`), "kind=a"))
	b.click(`#filter-form button[type="submit"]`)
	b.waitLoaded(`[data-view="queue"][data-filter="kind=a"]`)
	filter := map[string]string{"kind": "a"}
	if got, want := b.rows("#messages"), e.browse("orders", subjects.StatePending, filter); !slices.Equal(got, want) || len(want) != 1 {
		t.Errorf("filter kind=a: pending %v, browse says %v", got, want)
	}
	if got, want := evaluate[int](b, `Number(document.querySelector('#counts [data-count="pending"]').textContent)`), e.stats("orders", filter).Counts.Pending; got != want {
		t.Errorf("filter kind=a: pending count %d, stats say %d", got, want)
	}

	// The completed tab keeps the filter; its message links to the message page.
	b.click(`a[data-tab="completed"]`)
	b.waitLoaded(`[data-view="queue"][data-state="completed"][data-filter="kind=a"]`)
	if got, want := b.rows("#messages"), e.browse("orders", subjects.StateCompleted, filter); !slices.Equal(got, want) || !slices.Equal(want, []string{"order-1"}) {
		t.Errorf("completed tab: %v, browse says %v", got, want)
	}
	b.click(`#messages tr[data-message-id="order-1"] a`)
	b.waitLoaded(`[data-view="message"][data-message-id="order-1"]`)

	// The message page: fields, payload and the history timeline in order.
	h := e.history("orders", "order-1")
	type event struct {
		Kind    string `json:"kind"`
		Version uint64 `json:"version"`
	}
	got := evaluate[[]event](b, `[...document.querySelectorAll('#timeline tr')].map(r => ({kind: r.dataset.eventKind, version: Number(r.dataset.eventVersion)}))`)
	want := make([]event, len(h.Events))
	for i, ev := range h.Events {
		want[i] = event{string(ev.Kind), ev.Version}
	}
	if !slices.Equal(got, want) || kinds(h.Events) != "enqueued leased released leased completed" {
		t.Errorf("message page: timeline %v, history says %v", got, want)
	}
	if got := evaluate[string](b, `document.querySelector('#timeline tr[data-event-kind="released"] .event-error').textContent`); got != "upstream said 429 <b>" {
		t.Errorf("message page: the released event's error %q, want the release's, as text", got)
	}
	if got := evaluate[int](b, `Number(document.querySelector('#failures').dataset.failures)`); got != h.Failures || got != 1 {
		t.Errorf("message page: %d failures, history says %d", got, h.Failures)
	}
	if got := evaluate[string](b, `document.querySelector('#fields [data-field="state"]').textContent`); got != "completed" {
		t.Errorf("message page: state %q", got)
	}
	if got := evaluate[string](b, `document.querySelector('#payload pre').textContent`); got != `{"order": 1, "sku": "A-100"}` {
		t.Errorf("message page: payload %q", got)
	}
	if got := evaluate[int](b, `document.querySelectorAll('#lifebar .seg').length`); got < 1 {
		t.Errorf("message page: the life bar has %d segments", got)
	}
	b.noError()
	b.screenshot(shots, "dashboard-message.png")
	if got := evaluate[int](b, `document.querySelectorAll('#retry').length`); got != 0 {
		t.Errorf("a completed message's page offers %d retry buttons, want none", got)
	}

	// A message of the longest id wraps it, in the header and the heading, rather than make the
	// page scroll sideways.
	long := strings.Repeat("x", subjects.MaxIDLen)
	e.enqueue("orders", long, 9, "", nil)
	b.do(chromedp.Navigate(e.http.URL + "/#/queues/orders/messages/" + long))
	b.waitLoaded(`[data-view="message"][data-message-id="` + long + `"]`)
	if w := evaluate[[]int](b, `[document.documentElement.scrollWidth, window.innerWidth]`); w[0] > w[1] {
		t.Errorf("the page of a message of a %d-byte id is %d px wide in a window of %d", len(long), w[0], w[1])
	}

	// A canceled message's page retries it: pending again.
	b.do(chromedp.Navigate(e.http.URL + "/#/queues/orders/messages/order-5"))
	b.waitLoaded(`[data-view="message"][data-message-id="order-5"]`)
	b.poll(`document.querySelector('#retry') !== null`)
	b.click(`#retry`)
	b.poll(`document.querySelector('#fields [data-field="state"]').textContent === 'pending' && document.querySelector('#retry') === null`)
	if m, err := e.c.Get(ctx(t), "orders", "order-5"); err != nil || m.State != subjects.StatePending || m.Attempts != 0 {
		t.Errorf("after the retry button: %+v, %v; want pending with no attempt spent", m, err)
	}
	b.noError()

	// An invisible message's page makes it pending at once.
	if _, err := e.c.Enqueue(ctx(t), "orders", []byte(`{"order": 6}`), &workers.EnqueueOpts{ID: "order-6", Invisible: time.Hour}); err != nil {
		t.Fatal(err)
	}
	b.do(chromedp.Navigate(e.http.URL + "/#/queues/orders/messages/order-6"))
	b.waitLoaded(`[data-view="message"][data-message-id="order-6"]`)
	b.poll(`document.querySelector('#run-now') !== null`)
	b.click(`#run-now`)
	b.poll(`document.querySelector('#fields [data-field="state"]').textContent === 'pending' && document.querySelector('#run-now') === null`)
	if m, err := e.c.Get(ctx(t), "orders", "order-6"); err != nil || m.State != subjects.StatePending {
		t.Errorf("after the run now button: %+v, %v; want pending", m, err)
	}
	b.noError()

	// An action that fails says why, and the page's refreshes do not take that away: here a cancel
	// confirmed after the message changed (refreshes paused, so the confirmation stays armed on the
	// version shown). A click on the banner dismisses it.
	b.click(`#refresh-toggle`)
	b.click(`#cancel`)
	b.poll(`document.querySelector('#cancel-confirm') !== null`)
	if _, err := e.c.Reschedule(ctx(t), "orders", "order-6", workers.RescheduleOpts{Priority: ptr(int64(5))}); err != nil {
		t.Fatal(err)
	}
	refreshes := evaluate[string](b, `document.querySelector('[data-view="message"]').dataset.refreshes`)
	b.click(`#cancel-confirm`)
	b.poll(`document.querySelector('[data-view="message"]').dataset.refreshes !== ` + strconv.Quote(refreshes) +
		` && document.querySelector('#fields [data-field="version"]').textContent !== ''`)
	if got := evaluate[string](b, `document.getElementById('error').hidden ? '' : document.getElementById('error').textContent`); !strings.HasPrefix(got, "revision_mismatch: ") {
		t.Errorf("after a refused cancel and the refresh after it, the banner says %q, want the refusal", got)
	}
	b.click(`#error`)
	b.noError()
	b.expected("/api/queues/orders/cancel:1: Failed to load resource: the server responded with a status of 409")
	b.click(`#refresh-toggle`)

	// The pending message's page cancels it, at the second click.
	b.poll(`document.querySelector('#cancel') !== null`)
	b.click(`#cancel`)
	b.poll(`document.querySelector('#cancel-confirm') !== null && document.querySelector('#cancel') === null`)
	if m, err := e.c.Get(ctx(t), "orders", "order-6"); err != nil || m.State != subjects.StatePending {
		t.Errorf("after the first click on cancel: %+v, %v; want it still pending", m, err)
	}
	b.click(`#cancel-confirm`)
	b.poll(`document.querySelector('#fields [data-field="state"]').textContent === 'canceled'`)
	if m, err := e.c.Get(ctx(t), "orders", "order-6"); err != nil || m.State != subjects.StateCanceled {
		t.Errorf("after the confirmed cancel: %+v, %v; want canceled", m, err)
	}
	b.noError()

	// The queue page pauses a schedule, fires it now, and resumes it.
	b.do(chromedp.Navigate(e.http.URL + "/#/queues/orders"))
	b.waitLoaded(`[data-view="queue"][data-queue="orders"]`)
	nightly := `tr[data-schedule="nightly"]`
	b.poll(`document.querySelector('` + nightly + ` .schedule-pause') !== null`)
	b.click(nightly + ` .schedule-pause`)
	b.poll(`document.querySelector('` + nightly + ` .schedule-paused') !== null && document.querySelector('` + nightly + ` .schedule-resume') !== null`)
	b.click(nightly + ` .schedule-fire`)
	var fired subjects.ScheduleInfo
	waitFor(t, "the schedule fired by the button", func() bool {
		all, err := e.c.Schedules(ctx(t), "orders")
		if err == nil && len(all) == 1 {
			fired = all[0]
		}
		return fired.LastID != ""
	})
	if !fired.Paused || !strings.HasPrefix(fired.LastID, "nightly@") {
		t.Errorf("after pause and fire now: %+v, want paused, last_id nightly@<now>", fired)
	}
	if m, err := e.c.Get(ctx(t), "orders", fired.LastID); err != nil || m.State != subjects.StatePending {
		t.Errorf("the message fired by the button: %+v, %v; want pending", m, err)
	}
	b.click(nightly + ` .schedule-resume`)
	b.poll(`document.querySelector('` + nightly + ` .schedule-paused') === null && document.querySelector('` + nightly + ` .schedule-pause') !== null`)
	if all, err := e.c.Schedules(ctx(t), "orders"); err != nil || len(all) != 1 || all[0].Paused {
		t.Errorf("after the resume button: %+v, %v; want nightly not paused", all, err)
	}
	b.noError()

	// An exclusive queue running two messages of a value at once says so in its config.
	if _, err := e.c.CreateQueue(ctx(t), "pairs", &workers.QueueOpts{Type: subjects.Exclusive, ExclusivityKey: "tenant", MaxRunningPerValue: 2}); err != nil {
		t.Fatal(err)
	}
	b.do(chromedp.Navigate(e.http.URL + "/#/queues/pairs"))
	b.waitLoaded(`[data-view="queue"][data-queue="pairs"]`)
	b.poll(`[...document.querySelectorAll('#config dt')].some(dt => dt.textContent === 'type' && dt.nextElementSibling.textContent === 'exclusive by tenant, 2 running per value')`)

	// A state's messages come 50 to a page: the next page link shows the rest, the first page link
	// goes back.
	var bulk []workers.BatchMessage
	for i := range 53 {
		bulk = append(bulk, workers.BatchMessage{Payload: []byte("x"), EnqueueOpts: workers.EnqueueOpts{ID: fmt.Sprintf("bulk-%02d", i), Priority: ptr(int64(i))}})
	}
	if _, err := e.c.EnqueueBatch(ctx(t), "bulk", bulk); err != nil {
		t.Fatal(err)
	}
	all := e.browse("bulk", subjects.StatePending, nil)
	b.do(chromedp.Navigate(e.http.URL + "/#/queues/bulk"))
	b.waitLoaded(`[data-view="queue"][data-queue="bulk"][data-after=""]`)
	if got := b.rows("#messages"); !slices.Equal(got, all[:50]) || evaluate[bool](b, `document.querySelector('#page-first') !== null`) {
		t.Errorf("the first page: %v, want the first 50 of %v, without a first page link", got, all)
	}
	b.click(`#page-next`)
	b.waitLoaded(`[data-view="queue"][data-queue="bulk"]:not([data-after=""])`)
	if got := b.rows("#messages"); !slices.Equal(got, all[50:]) || evaluate[bool](b, `document.querySelector('#page-next') !== null`) {
		t.Errorf("the second page: %v, want %v and no next page link", got, all[50:])
	}
	b.click(`#page-first`)
	b.waitLoaded(`[data-view="queue"][data-queue="bulk"][data-after=""]`)
	b.noError()

	// A natstone that does not serve (a standby: its /readyz answers 503) says so in the header.
	// Whether it shows, not only its hidden attribute: a class's display once showed it always.
	shown := `getComputedStyle(document.getElementById('not-serving')).display !== 'none'`
	if evaluate[bool](b, shown) {
		t.Error("the header says not serving while /readyz says serving")
	}
	e.serving.Store(false)
	b.poll(shown)
	e.serving.Store(true)
	b.poll(`!(` + shown + `)`)
	b.expected("/readyz:1: Failed to load resource: the server responded with a status of 503")

	// A queue's block switches stay disabled until its flags are known: on the page of a queue that
	// does not exist, for good.
	b.do(chromedp.Navigate(e.http.URL + "/#/queues/nope"))
	b.poll(`!document.getElementById('error').hidden && document.getElementById('error').textContent.startsWith('queue_not_found')`)
	if !evaluate[bool](b, `document.querySelector('#toggle-enqueue-blocked').disabled && document.querySelector('#toggle-dequeue-blocked').disabled`) {
		t.Error("the block switches of a queue that does not exist can be clicked")
	}
	b.expected("/api/queues/nope")
	b.do(chromedp.Navigate(e.http.URL + "/#/queues/pairs"))
	b.waitLoaded(`[data-view="queue"][data-queue="pairs"]`)
	if evaluate[bool](b, `document.querySelector('#toggle-enqueue-blocked').disabled`) {
		t.Error("the block switches of a loaded queue are disabled")
	}
	b.noError()

	// Priorities past 2^53 are shown as stored, not rounded to a float's nearest: two that differ
	// by one stay apart.
	e.enqueue("exact", "near", 1795802017397123457, "", nil)
	e.enqueue("exact", "next", 1795802017397123458, "", nil)
	b.do(chromedp.Navigate(e.http.URL + "/#/queues/exact"))
	b.waitLoaded(`[data-view="queue"][data-queue="exact"]`)
	if got := evaluate[[]string](b, `[...document.querySelectorAll('#messages tr[data-message-id]')].map(r => r.dataset.messageId + '=' + r.dataset.priority)`); !slices.Equal(got, []string{"near=1795802017397123457", "next=1795802017397123458"}) {
		t.Errorf("priorities past 2^53: %v", got)
	}
	b.noError()

	// The refresh can be paused.
	b.click(`#refresh-toggle`)
	if got := evaluate[string](b, `document.getElementById('refresh-toggle').getAttribute('aria-pressed') + ' ' + document.getElementById('refresh-toggle').textContent`); got != "true Resume" {
		t.Errorf("after a click on pause: the button says %q", got)
	}
	b.checkConsole()
}

// tab is a headless Chromium tab driven by a test.
type tab struct {
	t   *testing.T
	ctx context.Context

	mu       sync.Mutex
	problems []string // console errors and uncaught exceptions
}

// startBrowser starts Debian's chromium (or $NATSTONE_CHROMIUM) headless, with a fresh profile in
// t.TempDir() and without the background traffic it would send to Google, and opens a tab. The
// browser is stopped, and waited for, at the test's cleanup.
func startBrowser(t *testing.T) *tab {
	t.Helper()
	path := cmp.Or(os.Getenv("NATSTONE_CHROMIUM"), defaultChromium)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the dashboard test needs Chromium: %v. Install it with `sudo apt-get install chromium` "+
			"(Debian, Ubuntu), or set NATSTONE_CHROMIUM to the path of a Chromium or Chrome binary", err)
	}
	profile := t.TempDir() // removed after the browser is stopped: cleanups run last-in first-out
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1280, 900),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	tabCtx, cancelTab := chromedp.NewContext(allocCtx)
	b := &tab{t: t, ctx: tabCtx}
	done := make(chan struct{})
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // waits for the browser to exit
		<-done
	})
	// The first action starts the browser, bound to the context it is given: one without a deadline.
	if err := chromedp.Do(tabCtx); err != nil {
		close(done)
		t.Fatalf("start %s: %v", path, err)
	}
	messages := chromedp.Console(tabCtx)
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				b.mu.Lock()
				b.problems = append(b.problems, fmt.Sprintf("%s %s:%d: %s", m.Type, m.URL, m.Line+1, m.Text))
				b.mu.Unlock()
			}
		}
	}()
	return b
}

// do runs browser actions, each within browserTimeout.
func (b *tab) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("browser: %v", err)
	}
}

// evaluate returns the value of a JavaScript expression in the page.
func evaluate[T any](b *tab, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("browser: evaluate %s: %v", expr, err)
	}
	return v
}

// waitLoaded waits until the view matching sel shows data.
func (b *tab) waitLoaded(sel string) {
	b.t.Helper()
	b.do(chromedp.WaitReady(chromedp.CSS(sel + `[data-loaded]`)))
}

// poll waits until a JavaScript expression is true in the page.
func (b *tab) poll(expr string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserTimeout)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(browserTimeout))); err != nil {
		b.t.Fatalf("browser: waiting for %s: %v", expr, err)
	}
}

// click clicks the element that selector finds, once there is one. The page re-renders its tables
// and buttons on every refresh, so a node that chromedp found may be gone when its click is
// dispatched ("Could not find node with given id"); a click from the page's own JavaScript finds
// and clicks the element in one step.
func (b *tab) click(selector string) {
	b.t.Helper()
	q, _ := json.Marshal(selector)
	b.poll(fmt.Sprintf(`(() => { const el = document.querySelector(%s); if (!el) return false; el.click(); return true })()`, q))
}

// rows returns the message ids of a table's rows, in order.
func (b *tab) rows(table string) []string {
	b.t.Helper()
	q, _ := json.Marshal(table + ` tbody tr[data-message-id]`)
	return evaluate[[]string](b, fmt.Sprintf(`[...document.querySelectorAll(%s)].map(r => r.dataset.messageId)`, q))
}

// noError checks that the page shows no error.
func (b *tab) noError() {
	b.t.Helper()
	if msg := evaluate[string](b, `document.getElementById('error').hidden ? '' : document.getElementById('error').textContent`); msg != "" {
		b.t.Errorf("the page shows an error: %s", msg)
	}
}

// screenshot saves a full-page PNG of the page as dir/name, if dir is set.
func (b *tab) screenshot(dir, name string) {
	b.t.Helper()
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, browserTimeout)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("browser: screenshot: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// checkConsole fails the test if the page logged an error or threw.
// expected waits for the console's report that contains what, a refusal the test itself provoked
// (the browser reports it as a failed resource load), and drops it.
func (b *tab) expected(what string) {
	b.t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(10 * time.Second); ; <-tick.C {
		b.mu.Lock()
		n := len(b.problems)
		b.problems = slices.DeleteFunc(b.problems, func(p string) bool { return strings.Contains(p, what) })
		dropped := n != len(b.problems)
		b.mu.Unlock()
		if dropped {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("the console never reported %q", what)
		}
	}
}

func (b *tab) checkConsole() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.problems) > 0 {
		b.t.Errorf("the browser console reported:\n%s", strings.Join(b.problems, "\n"))
	}
}

// countsMap returns counts keyed by state name, as the page's data attributes name them.
func countsMap(c subjects.Counts) map[string]int {
	return map[string]int{
		"invisible": c.Invisible, "pending": c.Pending, "running": c.Running,
		"completed": c.Completed, "canceled": c.Canceled, "errored": c.Errored,
	}
}

// TestDashboardShowsInvisibleCharacters: ids and metadata that bidirectional controls or zero-width
// characters make look like others ("invoice-\u202E2401" reads as "invoice-1042") show those
// characters as ⟨U+…⟩, so that an operator can tell the messages apart; a payload is shown as it is.
func TestDashboardShowsInvisibleCharacters(t *testing.T) {
	t.Parallel()
	e := setup(t)
	b := startBrowser(t)
	e.createQueue("spoof", nil)
	e.enqueue("spoof", "invoice-1042", 1, "plain", map[string]string{"owner": "admin"})
	e.enqueue("spoof", "invoice-\u202e2401\u202c", 2, "family: 👨\u200d👩\u200d👧", map[string]string{"owner": "\u202enimda\u202c"})
	e.enqueue("spoof", "invoice-1042\u200b", 3, "", nil)
	e.enqueue("spoof", "invoice-10\u034f42", 4, "", nil) // a combining grapheme joiner: drawn as nothing, not a format character

	b.do(chromedp.Navigate(e.http.URL + "/#/queues/spoof"))
	b.waitLoaded(`[data-view="queue"][data-queue="spoof"]`)
	links := evaluate[[]string](b, `[...document.querySelectorAll('#messages tbody tr[data-message-id] td:first-child a')].map(a => a.textContent)`)
	if want := []string{"invoice-1042", "invoice-⟨U+202E⟩2401⟨U+202C⟩", "invoice-1042⟨U+200B⟩", "invoice-10⟨U+034F⟩42"}; !slices.Equal(links, want) {
		t.Errorf("the pending messages' ids read %q, want %q", links, want)
	}
	pairs := evaluate[[]string](b, `[...document.querySelectorAll('#messages tbody .pair')].map(p => p.textContent)`)
	if want := []string{"owner=admin", "owner=⟨U+202E⟩nimda⟨U+202C⟩"}; !slices.Equal(pairs, want) {
		t.Errorf("the pending messages' metadata reads %q, want %q", pairs, want)
	}

	b.click("#messages tr[data-message-id=\"invoice-\u202e2401\u202c\"] a")
	b.waitLoaded("[data-view=\"message\"][data-message-id=\"invoice-\u202e2401\u202c\"]")
	if got := evaluate[string](b, `document.querySelector('h1').textContent`); got != "Message invoice-⟨U+202E⟩2401⟨U+202C⟩" {
		t.Errorf("the message page's title reads %q", got)
	}
	if got := evaluate[string](b, `document.querySelector('#payload pre').textContent`); got != "family: 👨\u200d👩\u200d👧" {
		t.Errorf("the payload reads %q, want it as enqueued", got)
	}
	b.noError()
}
