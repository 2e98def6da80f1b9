// Package interop proves that natstone can be driven by a client written in another language from
// the wire protocol alone.
//
// The js directory holds a small Node.js client (client.mjs) written only from docs/protocol.md with
// the official NATS client for node, @nats-io/transport-node, pinned by package-lock.json. The test
// installs it with `npm ci` when js/node_modules is missing, runs it against a broker on an
// in-process JetStream server, and then checks the client's effects from Go with plain NATS
// requests: message states, the binary payload of enqueue_raw, EDF order and the error codes of the
// protocol's error table. A second script, serving.mjs, long-polls across a broker's replacement:
// it sends its poll again when a broker announces that it serves, as docs/protocol.md says a
// client should. node and npm must be on PATH; without them the test fails rather than being
// skipped.
package interop
