// A client's long poll across a broker's replacement, written from docs/protocol.md ("Subjects")
// alone: a long poll parked at a broker that dies is answered by nobody, and a client that hears a
// broker announce on <prefix>.serving that it serves, after it sent such a poll, sends the poll
// again with the same request_id. Run by test/interop/interop_test.go:
//
//   NATS_URL=nats://127.0.0.1:4222 node serving.mjs queue
//
// The test answers nothing to the first poll (its broker "dies"), then starts a broker, which
// announces, and enqueues one message, m1. The script checks the announcement's body and that the
// poll sent again gets m1, and prints one JSON line: {"ok":true,"announcement":{…}}, or
// {"ok":false,"error":"…"} (exit status 1).

import { connect, createInbox } from "@nats-io/transport-node";

const PREFIX = process.env.NATSTONE_PREFIX || "natstone.v1";
const TIMESTAMP = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,3})?Z$/;
const queue = process.argv[2];
const enc = new TextEncoder();
const dec = new TextDecoder();

async function run(nc) {
  // Subscribed before the poll is sent: an announcement after it says the poll's broker is gone.
  const announcements = nc.subscribe(`${PREFIX}.serving`, { max: 1 });
  await nc.flush();
  const poll = enc.encode(JSON.stringify({ request_id: "js-poll-1", wait_ms: 60000 }));
  nc.publish(`${PREFIX}.dequeue.${queue}`, poll, { reply: createInbox() }); // never answered
  let announced;
  for await (const m of announcements) {
    announced = JSON.parse(dec.decode(m.data));
  }
  if (typeof announced?.id !== "string" || announced.id === "" || !TIMESTAMP.test(announced.started ?? "")) {
    throw new Error(`announcement ${JSON.stringify(announced)}: want {"id":"<service id>","started":"<RFC 3339 UTC>"}`);
  }
  // Sent again with the same request_id; the queue may not exist yet, just after the start.
  for (let tries = 0; ; tries++) {
    const reply = await nc.request(`${PREFIX}.dequeue.${queue}`, poll, { timeout: 70000 });
    const body = JSON.parse(dec.decode(reply.data));
    if (body.error?.code === "queue_not_found" && tries < 100) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      continue;
    }
    const ids = (body.messages ?? []).map((m) => m.id);
    if (body.error || ids.length !== 1 || ids[0] !== "m1") {
      throw new Error(`the poll sent again: ${JSON.stringify(body)}, want m1`);
    }
    return announced;
  }
}

const nc = await connect({ servers: process.env.NATS_URL });
try {
  const announcement = await run(nc);
  console.log(JSON.stringify({ ok: true, announcement }));
} catch (err) {
  console.error(err.message);
  console.log(JSON.stringify({ ok: false, error: err.message }));
  process.exitCode = 1;
} finally {
  await nc.close();
}
