// Package web is the HTTP listener of `natstone serve --http HOST:PORT`: a JSON API over the broker's
// queues and messages, and a dashboard that uses it. Everything it shows comes from the broker over
// NATS through a [workers.Client]; it keeps no state of its own.
//
// # JSON API
//
// Replies are JSON objects with snake_case fields, timestamps in RFC 3339 (UTC) and durations in
// milliseconds (…_ms), as on the wire (docs/protocol.md). Every reply carries
// Cache-Control: no-store.
//
//	GET  /api/queues?limit=100&after=…
//	     Up to limit (1 to MaxQueuesPage, default QueuesPage) queues sorted by name, those after
//	     after if given: {"queues": [{"name", "type", "exclusivity_key", "enqueue_blocked",
//	     "dequeue_blocked", "counts": {<state>: n, …}, "oldest_pending_ms", "rates": {"enqueued",
//	     "dequeued", "completed", "errored"}}, …], "limit", "more", "next"}; with more, next is the
//	     after of the next page. Rates are transitions per second over the last minute;
//	     oldest_pending_ms is how long the longest-waiting pending message has waited (0 if none).
//	     Each queue listed costs the broker a stats request.
//
//	GET  /api/queues/{name}[?filter=k=v…]
//	     One queue: {"name", "revision", "created_at", "config": {…}, "at", "counts",
//	     "oldest_pending_ms", "rates", "totals": {…}, "expiring": [{"id", "lease_id",
//	     "lease_expires_at", "expires_in_ms", "attempts", "max_attempts"}, …], "schedules": [<the
//	     protocol's schedules>]}. With filters, counts
//	     and oldest_pending_ms cover only the matching messages (and "filter" echoes them); rates,
//	     totals and expiring leases (those ending within 30 s) are the queue's.
//
//	GET  /api/queues/{name}/messages?state=pending&filter=k=v&filter=k2=v2&limit=50&after=…
//	     Up to limit (1 to 1000, default 50) messages of one state (default pending) in that state's
//	     order — pending earliest deadline first, invisible by when they become pending, running by
//	     lease expiry, completed/canceled/errored by when they ended — optionally only those whose
//	     metadata has every filter pair: {"queue", "state", "filter", "limit", "messages": [<message>,
//	     …], "more", "next"}. A message: {"id", "queue", "state", "priority", "metadata", "version",
//	     "attempts", "attempts_left", "lease_id", "lease_expires_at", "enqueued_at", "visible_at",
//	     "updated_at", "ended_at"}, without its payload. "more" is true when more messages matched;
//	     "next" is then the after of the next page (protocol.md's browse cursor: given back as it
//	     is, with the same state and filter).
//
//	GET  /api/queues/{name}/messages/{id}
//	GET  /api/queues/{name}/message?id={id}
//	     One message and its history (the second form for any id, "." and ".." included, which a
//	     browser removes from a path as dot segments even when escaped): {"message": <message> + {"payload_size", "payload" (UTF-8)
//	     or "payload_base64" (other bytes), "payload_omitted"}, "history": {"events": [{"kind",
//	     "state", "prev_state", "reason", "version", "attempts", "max_attempts", "lease_id",
//	     "lease_expires_at", "worker", "request_id", "error", "at", "state_ms", "current"}, …], "state_ms":
//	     {<state>: ms}, "failures", "collected", "truncated"}, "history_error": {"code", "message"}}.
//	     The payload is included only up to 4 KiB (MaxPayloadPreview); a larger one is left out with
//	     payload_omitted set. "message" is null once the message was garbage-collected: its history
//	     outlives it for the events stream's max age. When the history cannot be read (the broker
//	     runs without events) "history" is null and "history_error" says why. 404
//	     message_not_found when the message does not exist and no history of it can be read.
//
//	POST /api/queues/{name}/blocked
//	     Body {"enqueue_blocked": bool, "dequeue_blocked": bool}, each optional but at least one
//	     given, sent with Content-Type: application/json (a cross-site form cannot send that without
//	     a CORS preflight, which this server never grants) and at most 1 KiB. Sets the queue's pause
//	     flags; the reply is the queue's info as the broker's update returns it: {"name", "config",
//	     "revision", "created_at", "counts"}. A POST from a page of another origin (Sec-Fetch-Site,
//	     else Origin against Host: net/http's CrossOriginProtection) is refused with 403 bad_request.
//
//	POST /api/queues/{name}/retry
//	     Body {"id": string, "version": number}, both required, sent as the blocked flags are.
//	     Retries the errored or canceled message at that version (the protocol's retry): the reply
//	     is the message as in the list of messages (one that is not finished any more is left as it
//	     is). 409 revision_mismatch if it finished again since, 409 invalid_state for a completed
//	     one, 404 message_not_found.
//
//	POST /api/queues/{name}/cancel
//	     Body {"id": string, "version": number}, both required, sent as the blocked flags are. An
//	     operator's cancel of the message at that version (the protocol's cancel with version): the
//	     reply is the message as in the list of messages (one canceled since is left as it is). 409
//	     revision_mismatch if it changed since, 409 invalid_state for a completed or errored one,
//	     404 message_not_found.
//
//	POST /api/queues/{name}/reschedule
//	     Body {"id": string, "version": number, "priority": number, "delay_ms": number}: id and
//	     version required, and priority, delay_ms or both, sent as the blocked flags are.
//	     Reschedules the pending or invisible message at that version (the protocol's reschedule):
//	     a new priority, or pending delay_ms from now (0: at once). The reply is the message as in
//	     the list of messages. 409 revision_mismatch if it changed since, 409 invalid_state if it is
//	     running or finished, 404 message_not_found, 400 out_of_range for a delay_ms outside 0 to
//	     366 days.
//
//	POST /api/queues/{name}/schedules/{schedule}/pause
//	POST /api/queues/{name}/schedules/{schedule}/resume
//	     Body {"note": string}, or {}, sent as the blocked flags are (the body's 1 KiB bounds the
//	     note). Pauses the schedule, or resumes it (the protocol's schedule_pause and
//	     schedule_resume): the reply is the schedule, as in the queue's "schedules". 404
//	     schedule_not_found.
//
//	POST /api/queues/{name}/schedules/{schedule}/fire
//	     Body {"id": string}, or {} for the id <schedule>@<now, to the ms>. Fires the schedule now, paused or
//	     not (the protocol's schedule_fire): the reply is the schedule, its last_id the message
//	     enqueued. 400 invalid_id for an id given empty (as the broker's: retried, it would fire
//	     again), 404 schedule_not_found, 409 invalid_state for an overlap skip schedule whose last
//	     fire's message is not finished, 409 queue_blocked.
//
// With [Config.Hosts] set, a request whose Host header names another host is answered 421 bad_request: a page
// of a site whose name was made to resolve to the listener's address (DNS rebinding) is same-origin
// to the browser and would otherwise read the API and toggle the flags. natstone serve sets the
// loopback names when --http is a loopback address; else localhost, the --http name and the
// --http-host names, with [Config.AnyIP] (a Host that is an IP address is no rebinding). /metrics,
// /healthz, /readyz and requests without a Host are answered whatever the name.
//
// # Errors
//
// A failed request is answered with {"error": {"code": "…", "message": "…"}}. An error reply of the
// broker keeps its code and the HTTP status of [subjects.Code.Status] (queue_not_found and
// message_not_found → 404, invalid_queue_name → 400, …). When the broker cannot be reached the
// reply is 503 with code unavailable: at once when no broker listens (no responders), after the
// client's request timeout (10 s by default) when no reply comes, as while the NATS connection is
// down and reconnecting. Bad input is refused before anything
// is sent to the broker: 400 bad_request for an unknown query parameter, a filter that is not
// key=value, an unknown state, a malformed body, a body without any flag, a retry, cancel or reschedule without id
// or version, or a reschedule without priority or delay_ms; 400 invalid_metadata for
// a filter outside the protocol's limits; 400 out_of_range for a limit outside 1 to 1000; 415
// bad_request for a POST that is not application/json; 413 bad_request for a body over 1 KiB.
// Unknown paths and methods get the standard library's plain-text 404 and 405.
//
// # Dashboard
//
// GET / serves a single-page dashboard (index.html, app.js, style.css and favicon.svg, embedded in
// the binary; no build step, nothing loaded from elsewhere, Content-Security-Policy default-src
// 'self'). Its hash routes: #/ the queues; #/queues/<name>[?state=…&filter=k=v,k2=v2&after=…] a queue with its counts, rates,
// leases about to expire, blocked switches (blocking asks for a second click), its schedules (each with Pause or Resume and Fire now
// buttons) and its messages by state, 50 to a page (next and first page links); #/queues/<name>/messages/<id>
// a message with its payload preview, history timeline and, errored or canceled, a Retry button
// (invisible: a Run now button, a reschedule with delay_ms 0; not finished: a Cancel button, which
// asks for a second click). It refreshes every 2 seconds unless
// paused.
//
// When set, Config.Metrics, Config.Health and Config.Ready are served at GET /metrics, GET /healthz
// and GET /readyz; with Ready, the dashboard's header says "not serving" while it answers 503.
package web
