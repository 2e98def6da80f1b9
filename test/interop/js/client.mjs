// A natstone client written from docs/protocol.md alone, with the official NATS client for node.
//
//   NATS_URL=nats://127.0.0.1:4222 node client.mjs [queue]
//
// The queue name comes from argv[2], else NATSTONE_QUEUE, else a generated one; the subject prefix
// from NATSTONE_PREFIX (default natstone.v1). The script creates an exclusive queue, enqueues
// messages with JSON and with enqueue_raw, dequeues them in earliest-deadline-first order, checks
// exclusivity, completes with the lease id, checks the error replies of the protocol's error table
// and reads the depth; then settles with next, releases with an error and retries the errored
// message, and reads payloads in both forms and the list of queues. On success it prints one JSON line to stdout:
//
//   {"ok":true,"queue":"…","steps":["…",…],"errors":[{"code":"…","status":409,"op":"…"},…]}
//
// On any mismatch with the protocol it prints {"ok":false,…} to stdout, a clear message to stderr,
// and exits with status 1. test/interop/interop_test.go runs it against a real broker and then
// checks its effects from Go.

import { connect, headers, Match } from "@nats-io/transport-node";

const PREFIX = process.env.NATSTONE_PREFIX || "natstone.v1";
const REQUEST_TIMEOUT_MS = 5000;
const QUEUE_NAME = /^[A-Za-z0-9_-]{1,128}$/;
// RFC 3339 in UTC with millisecond precision. docs/protocol.md shows three fraction digits
// (2026-11-22T15:04:05.123Z), but the broker trims trailing zeros (…:05.7Z, or …:05Z on a whole
// second), so a client must accept 0 to 3 digits.
const TIMESTAMP = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,3})?Z$/;
const COUNT_KEYS = ["invisible", "pending", "running", "completed", "canceled", "errored"];

const steps = [];
const errorsSeen = [];
let current = "start";

class Mismatch extends Error {}

function fail(what) {
  throw new Mismatch(what);
}

function check(cond, what) {
  if (!cond) fail(what);
}

// canonical is JSON with the keys of every object sorted, so that eq ignores key order.
function canonical(v) {
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (v !== null && typeof v === "object") {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(",")}}`;
  }
  return v === undefined ? "undefined" : JSON.stringify(v);
}

function eq(actual, expected, what) {
  const a = canonical(actual);
  const e = canonical(expected);
  if (a !== e) fail(`${what}: got ${a}, want ${e}`);
}

function isTimestamp(v, what) {
  check(typeof v === "string" && TIMESTAMP.test(v), `${what}: ${JSON.stringify(v)} is not an RFC 3339 UTC timestamp of at most millisecond precision`);
}

function isCounts(counts, want, what) {
  check(counts && typeof counts === "object", `${what}: counts missing`);
  eq(Object.keys(counts).sort(), [...COUNT_KEYS].sort(), `${what}: count names`);
  for (const k of COUNT_KEYS) {
    eq(counts[k], want[k] ?? 0, `${what}: counts.${k}`);
  }
}

function step(name) {
  current = name;
}

function done(summary) {
  steps.push(`${current}: ${summary}`);
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function bytesEqual(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function subject(op, queue) {
  return queue === undefined ? `${PREFIX}.${op}` : `${PREFIX}.${op}.${queue}`;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

// call sends one request and returns {body, error}. body is the decoded JSON reply; error is
// {code, message, status, header} when the broker answered with an error, else null. It checks
// that the error body and the micro framework's headers agree, as the Errors section says.
async function call(nc, op, queue, request, opts = {}) {
  const subj = subject(op, queue);
  let data;
  if (opts.raw !== undefined) {
    data = opts.raw;
  } else if (request === undefined) {
    data = new Uint8Array(0); // an empty body is the same as {}
  } else {
    data = encoder.encode(JSON.stringify(request));
  }
  let msg;
  try {
    msg = await nc.request(subj, data, { timeout: REQUEST_TIMEOUT_MS, headers: opts.headers });
  } catch (err) {
    const why = err?.message ?? String(err);
    const cause = err?.cause ? (err.cause.message ?? String(err.cause)) : why;
    fail(`request to ${subj} failed: ${why}${cause !== why ? ` (${cause})` : ""} — is a natstone broker serving ${PREFIX} on NATS_URL?`);
  }
  let text;
  let body;
  try {
    text = decoder.decode(msg.data);
    body = JSON.parse(text);
  } catch (err) {
    fail(`reply on ${subj} is not JSON: ${err.message}`);
  }
  check(body !== null && typeof body === "object" && !Array.isArray(body), `reply on ${subj} is not a JSON object: ${text}`);

  const hdrCode = msg.headers?.get("Nats-Service-Error-Code", Match.IgnoreCase) ?? "";
  const hdrMessage = msg.headers?.get("Nats-Service-Error", Match.IgnoreCase) ?? "";
  if (body.error === undefined) {
    check(hdrCode === "" && hdrMessage === "", `${subj}: reply has error headers (${hdrCode} ${hdrMessage}) but no error body: ${text}`);
    return { body, error: null };
  }
  const e = body.error;
  check(e && typeof e.code === "string" && e.code !== "", `${subj}: error body without a code: ${text}`);
  check(typeof e.message === "string" && e.message !== "", `${subj}: error body without a message: ${text}`);
  eq(Object.keys(body), ["error"], `${subj}: fields of an error reply`);
  check(/^[0-9]{3}$/.test(hdrCode), `${subj}: error reply ${text} without a numeric Nats-Service-Error-Code header (got ${JSON.stringify(hdrCode)})`);
  eq(hdrMessage, e.message, `${subj}: Nats-Service-Error header vs error.message`);
  return { body, error: { code: e.code, message: e.message, status: Number(hdrCode), header: hdrMessage } };
}

// ok sends a request that must succeed and returns the reply body.
async function ok(nc, op, queue, request, opts) {
  const { body, error } = await call(nc, op, queue, request, opts);
  if (error) fail(`${subject(op, queue)} ${JSON.stringify(request ?? null)}: unexpected error ${error.code} (${error.status}): ${error.message}`);
  return body;
}

// expectError sends a request that must fail with code and status, and records the pair.
async function expectError(nc, op, queue, request, code, status, opts) {
  const { body, error } = await call(nc, op, queue, request, opts);
  if (!error) fail(`${subject(op, queue)}: want error ${code}, got success ${JSON.stringify(body)}`);
  eq(`${error.code} ${error.status}`, `${code} ${status}`, `${subject(op, queue)}: error code and Nats-Service-Error-Code`);
  errorsSeen.push({ code: error.code, status: error.status, op });
  return error;
}

function checkEnqueueReply(r, id, state, priority, what) {
  eq(r.id, id, `${what}: id`);
  eq(r.state, state, `${what}: state`);
  eq(r.priority, priority, `${what}: priority`);
  check(Number.isInteger(r.version) && r.version >= 1, `${what}: version ${r.version}`);
  isTimestamp(r.visible_at, `${what}: visible_at`);
}

// checkMessage checks the fields every message reply has.
function checkMessage(m, queue, id, state, what) {
  eq(m.id, id, `${what}: id`);
  eq(m.queue, queue, `${what}: queue`);
  eq(m.state, state, `${what}: state`);
  check(Number.isInteger(m.priority), `${what}: priority ${m.priority}`);
  check(Number.isInteger(m.version) && m.version >= 1, `${what}: version ${m.version}`);
  check(Number.isInteger(m.attempts) && Number.isInteger(m.attempts_left), `${what}: attempts ${m.attempts}/${m.attempts_left}`);
  for (const k of ["enqueued_at", "visible_at", "updated_at"]) isTimestamp(m[k], `${what}: ${k}`);
  check(m.payload === undefined || m.payload_base64 === undefined, `${what}: both payload and payload_base64`);
}

function noPayload(m, what) {
  check(m.payload === undefined && m.payload_base64 === undefined, `${what}: a lease operation replies without the payload, got ${JSON.stringify(m)}`);
}

async function run(nc, q) {
  const aux = `${q}-aux`;
  const lease = {};

  step("create");
  const createBody = { type: "exclusive", exclusivity_key: "project" };
  const info = await ok(nc, "create", q, createBody);
  eq(info.name, q, "create: name");
  eq(info.config, {
    type: "exclusive", exclusivity_key: "project", lease_ms: 30000, invisible_ms: 0, max_attempts: 5,
    retention_ms: 86400000, max_payload_bytes: 32768, max_metadata_pairs: 8, max_running: 0, max_running_per_value: 1,
    enqueue_blocked: false, dequeue_blocked: false,
  }, "create: config with the documented defaults");
  check(Number.isInteger(info.revision), `create: revision ${info.revision}`);
  isTimestamp(info.created_at, "create: created_at");
  isCounts(info.counts, {}, "create");
  done(`exclusive queue ${q} on key "project", revision ${info.revision}`);

  step("create again");
  const again = await ok(nc, "create", q, createBody);
  eq([again.revision, again.created_at], [info.revision, info.created_at], "create again: idempotent");
  done("same config returns the same queue");

  step("enqueue m-a");
  const textPayload = "hello from node ✓";
  let r = await ok(nc, "enqueue", q, { id: "m-a", priority: 100, payload: textPayload, metadata: { project: "alpha", kind: "text" } });
  checkEnqueueReply(r, "m-a", "pending", 100, "enqueue m-a");
  check(r.duplicate !== true, "enqueue m-a: first enqueue reported duplicate");
  done("JSON, text payload, priority 100, project alpha");

  step("enqueue m-b");
  r = await ok(nc, "enqueue", q, { id: "m-b", priority: 200, metadata: { project: "alpha" } });
  checkEnqueueReply(r, "m-b", "pending", 200, "enqueue m-b");
  done("JSON, empty payload, priority 200, project alpha");

  step("enqueue m-c");
  r = await ok(nc, "enqueue", q, { id: "m-c", priority: 300, payload_base64: Buffer.from("from base64").toString("base64"), metadata: { project: "beta" } });
  checkEnqueueReply(r, "m-c", "pending", 300, "enqueue m-c");
  done("JSON, payload_base64, priority 300, project beta");

  step("enqueue m-a again");
  r = await ok(nc, "enqueue", q, { id: "m-a", priority: 1, payload: "other", metadata: { project: "alpha" } });
  eq(r.duplicate, true, "enqueue m-a again: duplicate");
  checkEnqueueReply(r, "m-a", "pending", 100, "enqueue m-a again (the existing message)");
  done("duplicate id returns the existing message");

  step("enqueue_raw m-raw");
  const rawBytes = new Uint8Array([0, 1, 2, 255]);
  const h = headers();
  h.set("Natstone-Id", "m-raw");
  h.set("Natstone-Priority", "250");
  h.set("Natstone-Metadata", JSON.stringify({ project: "gamma" }));
  r = await ok(nc, "enqueue_raw", q, undefined, { raw: rawBytes, headers: h });
  checkEnqueueReply(r, "m-raw", "pending", 250, "enqueue_raw m-raw");
  done("bytes [0,1,2,255], priority 250, project gamma from headers");

  step("depth");
  let d = await ok(nc, "depth", q);
  eq(d.queue, q, "depth: queue");
  isCounts(d.counts, { pending: 4 }, "depth");
  done("4 pending");

  step("dequeue 1");
  let dq = await ok(nc, "dequeue", q, {});
  check(Array.isArray(dq.messages), `dequeue 1: messages is not an array: ${JSON.stringify(dq)}`);
  eq(dq.messages.map((m) => m.id), ["m-a"], "dequeue 1: EDF order, lowest priority first");
  let m = dq.messages[0];
  checkMessage(m, q, "m-a", "running", "dequeue 1");
  eq(m.priority, 100, "dequeue 1: priority");
  eq(m.payload, textPayload, "dequeue 1: payload");
  eq(m.metadata, { project: "alpha", kind: "text" }, "dequeue 1: metadata");
  eq([m.attempts, m.attempts_left], [1, 4], "dequeue 1: attempts, attempts_left");
  check(typeof m.lease_id === "string" && m.lease_id !== "", "dequeue 1: lease_id");
  isTimestamp(m.lease_expires_at, "dequeue 1: lease_expires_at");
  check(Date.parse(m.lease_expires_at) > Date.parse(m.updated_at), "dequeue 1: lease_expires_at after updated_at");
  lease.a = m.lease_id;
  done("m-a (priority 100) leased, text payload intact");

  step("dequeue 2");
  dq = await ok(nc, "dequeue", q, { batch: 1, lease_ms: 60000 });
  eq(dq.messages.map((x) => x.id), ["m-raw"], "dequeue 2: m-b's project alpha is leased, so the next best free value");
  m = dq.messages[0];
  checkMessage(m, q, "m-raw", "running", "dequeue 2");
  eq(m.payload, undefined, "dequeue 2: payload (the bytes are not UTF-8)");
  eq(m.payload_base64, "AAEC/w==", "dequeue 2: payload_base64");
  check(bytesEqual([...Buffer.from(m.payload_base64, "base64")], [...rawBytes]), "dequeue 2: payload bytes");
  eq(m.metadata, { project: "gamma" }, "dequeue 2: metadata from the Natstone-Metadata header");
  check(m.lease_id !== lease.a, "dequeue 2: a fresh lease_id");
  lease.raw = m.lease_id;
  const rawVersion = m.version;
  done("m-b skipped (alpha leased); m-raw (priority 250) leased, bytes round-tripped");

  step("complete m-a");
  let c = await ok(nc, "complete", q, { id: "m-a", lease_id: lease.a });
  checkMessage(c, q, "m-a", "completed", "complete m-a");
  noPayload(c, "complete m-a");
  isTimestamp(c.ended_at, "complete m-a: ended_at");
  done(`completed with its lease, version ${c.version}`);

  step("complete m-a again");
  const c2 = await ok(nc, "complete", q, { id: "m-a", lease_id: lease.a });
  eq([c2.state, c2.version], ["completed", c.version], "complete m-a again: succeeds and writes nothing");
  done("idempotent, same version");

  step("lease_mismatch");
  const e = await expectError(nc, "complete", q, { id: "m-raw", lease_id: lease.a }, "lease_mismatch", 409);
  m = await ok(nc, "get", q, { id: "m-raw" });
  checkMessage(m, q, "m-raw", "running", "get m-raw after lease_mismatch");
  eq([m.version, m.lease_id], [rawVersion, lease.raw], "get m-raw after lease_mismatch: nothing changed");
  eq(m.payload_base64, "AAEC/w==", "get m-raw: payload_base64");
  done(`complete m-raw with m-a's lease: ${e.code}, Nats-Service-Error-Code ${e.status}, message ${JSON.stringify(e.message)}; m-raw unchanged`);

  step("depth");
  d = await ok(nc, "depth", q, { filter: {} });
  eq(d.queue, q, "depth: queue");
  isCounts(d.counts, { pending: 2, running: 1, completed: 1 }, "depth");
  d = await ok(nc, "depth", q, { filter: { project: "alpha" } });
  isCounts(d.counts, { pending: 1, completed: 1 }, "depth filter project=alpha");
  done("2 pending, 1 running, 1 completed; filter project=alpha: 1 pending, 1 completed");

  // The error table, code by code (all but unavailable and internal, which a client cannot cause).
  step("errors on the queue");
  await expectError(nc, "dequeue", q, { lease: 5000 }, "bad_request", 400);
  await expectError(nc, "enqueue", q, { id: "both", payload: "x", payload_base64: "eA==", metadata: { project: "x" } }, "bad_request", 400);
  const badHdr = headers();
  badHdr.set("Natstone-Priority", "soon");
  await expectError(nc, "enqueue_raw", q, undefined, "bad_request", 400, { raw: rawBytes, headers: badHdr });
  await expectError(nc, "complete", q, { id: "m-raw" }, "bad_request", 400);
  await expectError(nc, "info", "q".repeat(129), undefined, "invalid_queue_name", 400);
  await expectError(nc, "enqueue", q, { id: "x".repeat(257), metadata: { project: "x" } }, "invalid_id", 400);
  await expectError(nc, "enqueue", q, { id: "bad-md", metadata: { project: "x", "": "empty key" } }, "invalid_metadata", 400);
  await expectError(nc, "enqueue", q, { id: "no-key", metadata: { kind: "x" } }, "missing_exclusivity_key", 400);
  await expectError(nc, "dequeue", q, { batch: 257 }, "out_of_range", 400);
  await expectError(nc, "info", `${q}-missing`, undefined, "queue_not_found", 404);
  await expectError(nc, "create", q, { type: "simple" }, "queue_exists", 409);
  await expectError(nc, "get", q, { id: "never-enqueued" }, "message_not_found", 404);
  await expectError(nc, "extend", q, { id: "m-a", lease_id: lease.a }, "invalid_state", 409);
  d = await ok(nc, "depth", q);
  isCounts(d.counts, { pending: 2, running: 1, completed: 1 }, "depth after the refused requests");
  done("bad_request ×4, invalid_queue_name, invalid_id, invalid_metadata, missing_exclusivity_key, out_of_range, queue_not_found, queue_exists, message_not_found, invalid_state; depth unchanged");

  step("errors on a second queue");
  // Not max_attempts 0: in create a 0 means "the default" (docs/limits.md gives 1–1000).
  await expectError(nc, "create", aux, { max_attempts: 1001 }, "invalid_config", 400);
  const auxInfo = await ok(nc, "create", aux, { max_payload_bytes: 16 });
  eq([auxInfo.config.type, auxInfo.config.max_payload_bytes], ["simple", 16], "create aux: config");
  await expectError(nc, "enqueue", aux, { id: "big", payload: "x".repeat(17) }, "payload_too_large", 413);
  r = await ok(nc, "enqueue", aux, { id: "short", payload: "x".repeat(16) });
  checkEnqueueReply(r, "short", "pending", r.priority, "enqueue aux short");
  dq = await ok(nc, "dequeue", aux, { lease_ms: 100 });
  eq(dq.messages.map((x) => x.id), ["short"], "dequeue aux");
  const shortLease = dq.messages[0].lease_id;
  // Past lease_expires_at but well before the message could be leased again by anyone else.
  const wait = Date.parse(dq.messages[0].lease_expires_at) - Date.now() + 20;
  await sleep(Math.max(wait, 0));
  await expectError(nc, "complete", aux, { id: "short", lease_id: shortLease }, "lease_expired", 409);
  const upd = await ok(nc, "update", aux, { revision: auxInfo.revision, enqueue_blocked: true });
  eq(upd.config.enqueue_blocked, true, "update aux: enqueue_blocked");
  check(upd.revision !== auxInfo.revision, "update aux: a new revision");
  await expectError(nc, "enqueue", aux, { id: "blocked" }, "queue_blocked", 409);
  await expectError(nc, "update", aux, { revision: auxInfo.revision, dequeue_blocked: true }, "revision_mismatch", 409);
  const del = await ok(nc, "delete", aux);
  eq([del.name, del.messages], [aux, 1], "delete aux");
  done("invalid_config, payload_too_large, lease_expired, queue_blocked, revision_mismatch; deleted");

  step("complete with next");
  const nq = `${q}-next`;
  await ok(nc, "enqueue", nq, { id: "n-1", priority: 1 });
  await ok(nc, "enqueue", nq, { id: "n-2", priority: 2, payload: "second" });
  dq = await ok(nc, "dequeue", nq, {});
  eq(dq.messages.map((x) => x.id), ["n-1"], "dequeue next queue");
  await expectError(nc, "complete", nq, { id: "n-1", lease_id: dq.messages[0].lease_id, next: { wait_ms: 1000 } }, "out_of_range", 400);
  let s = await ok(nc, "complete", nq, { id: "n-1", lease_id: dq.messages[0].lease_id, next: { batch: 5 } });
  checkMessage(s, nq, "n-1", "completed", "complete n-1 with next");
  noPayload(s, "complete n-1 with next");
  check(s.next && Array.isArray(s.next.messages) && s.next.error === undefined, `complete n-1 with next: next ${JSON.stringify(s.next)}`);
  eq(s.next.messages.map((x) => x.id), ["n-2"], "complete n-1 with next: next messages");
  checkMessage(s.next.messages[0], nq, "n-2", "running", "next n-2");
  eq(s.next.messages[0].payload, "second", "next n-2: payload");
  s = await ok(nc, "release", nq, { id: "n-2", lease_id: s.next.messages[0].lease_id, delay_ms: 60000, next: {} });
  eq([s.state, s.next.messages.length], ["invisible", 0], "release n-2 with next: invisible, nothing next");
  await ok(nc, "delete", nq);
  done("complete with next leased n-2 with its payload; release with next found nothing; next with wait_ms: out_of_range");

  step("abandon a long poll");
  const aq = `${q}-abandon`;
  await ok(nc, "create", aq, {});
  // A long poll the client gives up on: it is abandoned with its request_id, and ends at once, empty.
  // (The broker may read the abandon before the poll: the poll then leases nothing, and ends at once
  // all the same. A poll left waiting would fail the request's timeout, far shorter than its wait.)
  const polling = call(nc, "dequeue", aq, { wait_ms: 60000, request_id: "js-poll-1" });
  let ab = await ok(nc, "abandon", aq, { request_id: "js-poll-1" });
  eq([ab.request_id, ab.released], ["js-poll-1", []], "abandon of a waiting poll: its id, nothing given back");
  const polled = await polling;
  eq([polled.error ?? null, polled.body.messages], [null, []], "the abandoned poll: answered empty");
  await ok(nc, "enqueue", aq, { id: "a-1", payload: "for the next worker" });
  dq = await ok(nc, "dequeue", aq, { request_id: "js-poll-1" });
  eq(dq.messages, [], "a dequeue with the abandoned id leases nothing");
  // A dequeue whose reply the client did not take: the abandon gives its lease back, attempt refunded.
  await ok(nc, "dequeue", aq, { request_id: "js-poll-2" });
  ab = await ok(nc, "abandon", aq, { request_id: "js-poll-2" });
  eq(ab.released, ["a-1"], "abandon of an answered dequeue: a-1 given back");
  m = await ok(nc, "get", aq, { id: "a-1" });
  eq([m.state, m.attempts], ["pending", 0], "a-1 after the abandon: pending, its attempt given back");
  await expectError(nc, "abandon", aq, {}, "bad_request", 400);
  await ok(nc, "delete", aq);
  done("a waiting poll ended empty; its id leases nothing after; an answered dequeue's lease given back with its attempt; no request_id: bad_request");

  step("release with an error, history, retry");
  const rq = `${q}-retry`;
  await ok(nc, "create", rq, { max_attempts: 3 });
  await ok(nc, "enqueue", rq, { id: "r-1", payload: "again", max_attempts: 1 });
  dq = await ok(nc, "dequeue", rq, {});
  eq([dq.messages[0].id, dq.messages[0].attempts_left], ["r-1", 0], "dequeue r-1: its own max_attempts");
  const why = "upstream said 429\n\tat fetch()";
  const rel = await ok(nc, "release", rq, { id: "r-1", lease_id: dq.messages[0].lease_id, error: why });
  eq(rel.state, "errored", "release r-1 on its only attempt");
  const hist = await ok(nc, "history", rq, { id: "r-1" });
  const last = hist.events[hist.events.length - 1];
  eq([last.kind, last.reason, last.error], ["errored", "released", why], "history r-1: the errored event carries the release's error");
  await expectError(nc, "retry", rq, { id: "r-1", version: rel.version + 1 }, "revision_mismatch", 409);
  const rt = await ok(nc, "retry", rq, { id: "r-1", version: rel.version });
  eq([rt.state, rt.attempts, rt.version], ["pending", 0, rel.version + 1], "retry r-1: pending, attempts anew");
  const rt2 = await ok(nc, "retry", rq, { id: "r-1", version: rel.version });
  eq([rt2.state, rt2.version], ["pending", rt.version], "retry r-1 again: writes nothing");
  dq = await ok(nc, "dequeue", rq, {});
  eq([dq.messages[0].id, dq.messages[0].payload, dq.messages[0].attempts], ["r-1", "again", 1], "dequeue the retried r-1");
  await ok(nc, "delete", rq);
  done("max_attempts 1 on enqueue; release with an error: errored, its history says why; retry fenced by version, again writes nothing; leased again");

  step("reschedule");
  const sq = `${q}-reschedule`;
  await ok(nc, "create", sq, {});
  await ok(nc, "enqueue", sq, { id: "s-1", payload: "one", priority: 10 });
  await ok(nc, "enqueue", sq, { id: "s-2", payload: "two", priority: 20 });
  await ok(nc, "enqueue", sq, { id: "s-3", payload: "three", priority: 1, invisible_ms: 3600000 });
  const at = new Date(Date.now() + 3600000);
  const va = await ok(nc, "enqueue", sq, { id: "s-4", payload: "four", visible_at: at.toISOString() });
  eq([va.state, new Date(va.visible_at).getTime()], ["invisible", at.getTime()], "enqueue s-4 visible_at an hour ahead (a JavaScript Date's ISO string)");
  await expectError(nc, "enqueue", sq, { id: "s-5", visible_at: at.toISOString(), invisible_ms: 5 }, "bad_request", 400);
  await expectError(nc, "reschedule", sq, { id: "s-2" }, "bad_request", 400);
  const rs = await ok(nc, "reschedule", sq, { id: "s-2", priority: 5, version: 1 });
  eq([rs.state, rs.priority, rs.version], ["pending", 5, 2], "reschedule s-2 to priority 5");
  const rs2 = await ok(nc, "reschedule", sq, { id: "s-2", priority: 5, version: 1 });
  eq(rs2.version, 2, "reschedule s-2 again: already as asked, writes nothing");
  const up = await ok(nc, "reschedule", sq, { id: "s-3", delay_ms: 0 });
  eq(up.state, "pending", "reschedule s-3 with delay_ms 0: pending at once");
  dq = await ok(nc, "dequeue", sq, { batch: 3 });
  eq(dq.messages.map((m) => m.id), ["s-3", "s-2", "s-1"], "dequeue in the new order");
  await expectError(nc, "reschedule", sq, { id: "s-1", priority: 0 }, "invalid_state", 409);
  await expectError(nc, "cancel", sq, { id: "s-1", version: 1 }, "revision_mismatch", 409);
  const cx = await ok(nc, "cancel", sq, { id: "s-1", version: dq.messages[2].version });
  eq(cx.state, "canceled", "an operator's cancel of s-1 at the version its lease gave");
  await ok(nc, "delete", sq);
  done("visible_at: invisible until a JavaScript Date, bad_request with invisible_ms; reschedule: bad_request without a change; a new priority, sent again writes nothing; an invisible message pending at once; a running one invalid_state; a cancel fenced by version");

  step("max_running");
  const mq = `${q}-max-running`;
  await expectError(nc, "create", mq, { max_running: -1 }, "invalid_config", 400);
  const mi = await ok(nc, "create", mq, { max_running: 2 });
  eq(mi.config.max_running, 2, "create with max_running 2");
  for (const id of ["r-1", "r-2", "r-3"]) {
    await ok(nc, "enqueue", mq, { id, payload: id });
  }
  let mr = await ok(nc, "dequeue", mq, { batch: 3 });
  eq(mr.messages.map((m) => m.id), ["r-1", "r-2"], "a batch of 3 under max_running 2 leases 2");
  mr = await ok(nc, "dequeue", mq, { batch: 3 });
  eq(mr.messages.length, 0, "nothing more while 2 run");
  const mu = await ok(nc, "update", mq, { max_running: 3 });
  eq(mu.config.max_running, 3, "update to max_running 3");
  mr = await ok(nc, "dequeue", mq, { batch: 3 });
  eq(mr.messages.map((m) => m.id), ["r-3"], "the room the update made");
  await ok(nc, "delete", mq);
  done("max_running: invalid_config below 0; a batch cut to the room left; an update makes room");

  step("max_running_per_value");
  const vq = `${q}-per-value`;
  await expectError(nc, "create", vq, { max_running_per_value: 2 }, "invalid_config", 400);
  await expectError(nc, "create", vq, { type: "exclusive", exclusivity_key: "p", max_running_per_value: 1001 }, "invalid_config", 400);
  const vi = await ok(nc, "create", vq, { type: "exclusive", exclusivity_key: "p", max_running_per_value: 2 });
  eq(vi.config.max_running_per_value, 2, "create with max_running_per_value 2");
  for (const id of ["v-1", "v-2", "v-3"]) {
    await ok(nc, "enqueue", vq, { id, metadata: { p: "foo" } });
  }
  const leased = [];
  for (let i = 0; i < 3; i++) {
    leased.push(...(await ok(nc, "dequeue", vq, { batch: 3 })).messages.map((m) => m.id));
  }
  eq(leased, ["v-1", "v-2"], "two of value foo run at once, a batch taking one; the third waits");
  eq((await ok(nc, "update", vq, { max_running_per_value: 3 })).config.max_running_per_value, 3, "update to 3");
  eq((await ok(nc, "dequeue", vq, { batch: 3 })).messages.map((m) => m.id), ["v-3"], "the room the update made");
  await ok(nc, "delete", vq);
  done("max_running_per_value: exclusive queues only, at most 1000; two of a value at once, a batch taking one; an update makes room");

  step("schedules");
  const cq = `${q}-schedules`;
  await ok(nc, "create", cq, {});
  await expectError(nc, "schedule", cq, { name: "tick", cron: "@every 500ms" }, "invalid_schedule", 400);
  await expectError(nc, "schedule", cq, { name: "tick", cron: "@every 1s", deadline_ms: -1 }, "out_of_range", 400);
  await expectError(nc, "schedule", cq, { name: "tick", cron: "@every 1s", overlap: "never" }, "invalid_schedule", 400);
  const si = await ok(nc, "schedule", cq, { name: "tick", cron: "@every 1s", payload: "tock", metadata: { kind: "tick" }, deadline_ms: 60000 });
  eq([si.name, si.cron, si.payload_bytes, si.deadline_ms, si.overlap, si.overlap_skipped], ["tick", "@every 1s", 4, 60000, "allow", 0], "schedule: the reply describes it");
  const si2 = await ok(nc, "schedule", cq, { name: "tick", cron: "@every 1s", payload: "tock", metadata: { kind: "tick" }, deadline_ms: 60000 });
  eq(si2.revision, si.revision, "the same schedule sent again writes nothing");
  const fired = await ok(nc, "dequeue", cq, { wait_ms: 10000 });
  eq(fired.messages.length, 1, "a dequeue waiting gets the first fire");
  const fm = fired.messages[0];
  check(fm.id.startsWith("tick@"), `the fired id ${fm.id} is tick@<fire time>`);
  eq([fm.payload, fm.metadata.kind, fm.priority], ["tock", "tick", Date.parse(fm.id.slice("tick@".length)) + 60000], "the fire's payload, metadata, and priority fire time + deadline_ms");
  // A second fire comes only once the first has stored its time: then schedules shows it.
  eq((await ok(nc, "dequeue", cq, { wait_ms: 10000 })).messages.length, 1, "a dequeue waiting gets the second fire");
  const sl = await ok(nc, "schedules", cq, {});
  eq(sl.schedules.map((x) => x.name), ["tick"], "schedules lists it");
  check(sl.schedules[0].last_at !== undefined && sl.schedules[0].next_at > sl.schedules[0].last_at, "schedules: last_at, and next_at after it");
  const ps = await ok(nc, "schedule_pause", cq, { name: "tick", note: "maintenance" });
  eq([ps.paused, ps.note, typeof ps.paused_at], [true, "maintenance", "string"], "schedule_pause: paused, with its note and time");
  eq((await ok(nc, "schedule_pause", cq, { name: "tick", note: "maintenance" })).revision, ps.revision, "the same pause sent again writes nothing");
  await expectError(nc, "schedule_pause", cq, { name: "nope" }, "schedule_not_found", 404);
  await expectError(nc, "schedule_resume", cq, { name: "tick", note: "a\u0001" }, "bad_request", 400);
  const byHand = await ok(nc, "schedule_fire", cq, { name: "tick", id: "by-hand" });
  eq([byHand.last_id, byHand.paused], ["by-hand", true], "schedule_fire while paused: last_id is the id given");
  eq((await ok(nc, "schedule_fire", cq, { name: "tick", id: "by-hand" })).revision, byHand.revision, "the same fire sent again writes nothing");
  await expectError(nc, "schedule_fire", cq, { name: "tick", id: "x".repeat(257) }, "invalid_id", 400);
  const resumed = await ok(nc, "schedule_resume", cq, { name: "tick" });
  eq([resumed.paused, resumed.note, resumed.paused_at], [false, undefined, undefined], "schedule_resume: not paused, no note");
  eq((await ok(nc, "unschedule", cq, { name: "tick" })).removed, true, "unschedule removes it");
  eq((await ok(nc, "unschedule", cq, { name: "tick" })).removed, false, "unschedule again: removed false");
  await ok(nc, "delete", cq);
  done("schedule: invalid_schedule, out_of_range; the same schedule again writes nothing; a fire's id, payload and priority; schedules; pause, fire by hand, resume; unschedule twice");

  step("payload forms");
  // A reply carries a payload as a JSON string when escapes grow it by at most half, else as
  // payload_base64 (docs/protocol.md, Conventions); <, > and & are written as they are.
  const pq = `${q}-payloads`;
  const html = '<p class="x">a &amp; b</p>';
  const nuls = "\u0000".repeat(32); // valid UTF-8, but six bytes each in a JSON string
  await ok(nc, "enqueue", pq, { id: "html", priority: 1, payload: html });
  await ok(nc, "enqueue", pq, { id: "nuls", priority: 2, payload: nuls });
  const raw = await nc.request(subject("dequeue", pq), encoder.encode(JSON.stringify({ batch: 2 })), { timeout: REQUEST_TIMEOUT_MS });
  const text = decoder.decode(raw.data);
  check(text.includes('"payload":"<p class=\\"x\\">a &amp; b</p>"'), `dequeue payloads: the HTML payload as written, unescaped: ${text}`);
  const pd = JSON.parse(text);
  eq(pd.messages.map((x) => x.id), ["html", "nuls"], "dequeue payloads: ids");
  eq([pd.messages[0].payload, pd.messages[0].payload_base64], [html, undefined], "html: payload");
  eq([pd.messages[1].payload, Buffer.from(pd.messages[1].payload_base64, "base64").toString("utf8")], [undefined, nuls], "nuls: payload_base64");
  done("HTML as payload, unescaped; 32 NULs as payload_base64");

  step("list");
  await ok(nc, "create", `${q}-z`, {}); // with pq, three queues at least: paging has pages
  const list = await ok(nc, "list");
  check(Array.isArray(list.queues), "list: queues");
  const names = list.queues.map((x) => x.name);
  check(names.includes(q) && !names.includes(aux), `list: want ${q} and not ${aux}, got ${JSON.stringify(names)}`);
  eq(names, [...names].sort(), "list: sorted by name");
  check(list.more === undefined, `list: more ${list.more} on a short list`);
  // Paged one at a time with after and limit, the list is the same.
  const paged = [];
  for (let after = undefined; ;) {
    const page = await ok(nc, "list", undefined, after === undefined ? { limit: 1 } : { after, limit: 1 });
    check(page.queues.length <= 1, `list limit 1: ${page.queues.length} queues`);
    paged.push(...page.queues.map((x) => x.name));
    if (!page.more) break;
    check(page.queues.length === 1 && paged.length <= names.length, `list: more after ${JSON.stringify(paged)}`);
    after = paged[paged.length - 1];
  }
  eq(paged, names, "list paged by one");
  await expectError(nc, "list", undefined, { limit: 0.5 }, "bad_request", 400);
  await expectError(nc, "list", undefined, { after: "a.b" }, "invalid_queue_name", 400);
  check(names.length >= 3, `list: ${names.length} queues, want ${q}, ${pq} and ${q}-z at least`);
  await ok(nc, "delete", pq);
  await ok(nc, "delete", `${q}-z`);
  done(`${names.length} queue(s), ${q} among them; the same paged by one`);
}

async function main() {
  const url = process.env.NATS_URL;
  if (!url) {
    console.error("natstone interop: NATS_URL is not set (e.g. NATS_URL=nats://127.0.0.1:4222)");
    process.exit(2);
  }
  const q = process.argv[2] || process.env.NATSTONE_QUEUE || `js-${Date.now()}-${Math.floor(Math.random() * 1e6)}`;
  if (!QUEUE_NAME.test(q) || q.length > 124) {
    console.error(`natstone interop: queue name ${JSON.stringify(q)} must be 1 to 124 characters of A-Z a-z 0-9 _ -`);
    process.exit(2);
  }

  let nc;
  try {
    nc = await connect({ servers: url, name: "natstone-interop-js" });
  } catch (err) {
    console.error(`natstone interop: cannot connect to ${url}: ${err.message}`);
    process.exit(1);
  }
  let result;
  try {
    await run(nc, q);
    result = { ok: true, queue: q, steps, errors: errorsSeen };
  } catch (err) {
    const what = err instanceof Mismatch ? err.message : (err?.stack ?? String(err));
    result = { ok: false, queue: q, failed_step: current, error: what, steps };
    console.error(`natstone interop: FAIL at step "${current}": ${what}`);
    process.exitCode = 1;
  } finally {
    await nc.close();
  }
  process.stdout.write(JSON.stringify(result) + "\n");
}

await main();
