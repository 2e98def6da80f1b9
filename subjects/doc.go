// Package subjects is natstone's wire contract: the NATS subjects the broker answers, the JSON
// request and reply bodies, the headers of the raw enqueue form, and the error codes.
//
// It depends only on the standard library so that the broker and every client agree on the protocol
// by construction. Only this package builds or parses subject strings.
//
// Every operation is a NATS request to
//
//	<prefix>.<op>.<queue>      e.g. natstone.v1.enqueue.encode
//	<prefix>.list              the queue list
//
// with a JSON body (or, for enqueue_raw, the payload itself as the body and attributes in headers).
// A failed request is answered with an [ErrorReply] body and the NATS micro service error headers
// (Nats-Service-Error, Nats-Service-Error-Code). docs/protocol.md describes every body.
package subjects
