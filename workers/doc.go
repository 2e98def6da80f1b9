// Package workers is natstone's Go client and worker runtime.
//
// A [Client] sends the requests of natstone's protocol (docs/protocol.md) over a NATS connection:
// queue administration, enqueue, dequeue, the lease holder's complete/extend/release/cancel, and
// queries. A [Worker] runs a [Handler] on a queue's messages: it long-polls for messages, extends
// their leases while the handler runs, and completes, releases (with backoff) or cancels each one by
// what the handler returned. A failed handler's error goes with the release ([FailureText]): the
// message's history ([Client.History]) shows why each attempt failed. A handler whose message is
// not ready to run returns [Snooze]: it waits, with its attempt given back. A handler whose message
// someone else cancels is told within moments ([WorkerConfig].Events). A slot's complete (or the release of a failed attempt) also leases the
// slot's next message, in the same request ([Client.CompleteNext]): a slot costs one round trip per
// message while the queue has work, and long-polls only when it has none.
//
// A Worker rides out a broker that is briefly gone or unavailable. A dequeue whose outcome is
// unknown (no reply in time, or unavailable) is sent again with its request id, so the broker
// returns any lease it took instead of leaving that message to expire unprocessed, and such a
// message's lease is extended at once. A complete, release or cancel is sent again, with backoff
// (100 ms doubling to 2 s), for as long as the lease may hold, or until Stop's ctx is done (then once more, briefly). Stop
// abandons the long polls it leaves ([Client.Abandon]), so that the broker leases nothing to a
// worker that stopped. A worker killed without Stop leaves nothing leased either, once its
// connection is gone: the replies its polls get reach nobody, and the broker gives their leases
// back, their attempts refunded. A Worker does not give up on a connection closed for good
// ([nats.Conn.Close], or the Stop of an embedded natstone whose Connect it uses): it polls on, each
// failure logged with backoff. Stop the workers before their connection, and give it
// [nats.MaxReconnects](-1): nats.go gives up reconnecting after 60 tries by default, about two
// minutes, and a natstone down longer would leave the workers polling on a connection closed for
// good. A long poll in flight when the connection reconnects is sent again at once, with its
// request id: the broker it waited at may be gone with its NATS server. So a worker takes messages
// again as soon as its connection is back, which nats.go tries every 2 s by default
// ([nats.ReconnectWait]); and as soon as a broker that replaces one that died while its NATS server
// stayed up announces that it serves (WorkerConfig.PollWait).
//
//	nc, _ := nats.Connect(nats.DefaultURL, nats.MaxReconnects(-1))
//	c, _ := workers.NewClient(nc, nil)
//	c.Enqueue(ctx, "emails", []byte("hello"), &workers.EnqueueOpts{Deadline: time.Now().Add(time.Hour)})
//
//	w, _ := workers.NewWorker(c, &workers.WorkerConfig{Queue: "emails", Concurrency: 4},
//		workers.HandlerFunc(func(ctx context.Context, job *workers.Job) error {
//			return send(ctx, job.Payload) // nil: completed; error: retried later; workers.Discard(err): canceled;
//			// workers.Snooze(time.Minute): not ready, asked again in a minute, no attempt spent
//		}))
//	w.Start(ctx)
//	defer func() { // on the way out: running handlers get 30 s to finish
//		stop, cancel := context.WithTimeout(context.Background(), 30*time.Second)
//		defer cancel()
//		w.Stop(stop)
//	}()
//
// Errors the broker replies with are [*APIError] values that match the Err… sentinels with
// errors.Is (errors.Is(err, workers.ErrLeaseExpired)); transport errors wrap nats.go's
// (nats.ErrTimeout, and nats.ErrNoResponders when no broker is running for the prefix).
//
// Durations given are time.Duration here and whole milliseconds on the wire: they are rounded
// down. Replies other than messages ([Message], with time.Time fields) are the protocol's own
// types (package subjects), with durations in milliseconds (QueueInfo.Config.LeaseMS,
// StatsReply.OldestPendingMS), as on the wire.
// The package never imports nats-server: a program embeds the server itself if it wants one
// (see the Embedded example).
package workers
