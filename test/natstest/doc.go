// Package natstest runs an in-process nats-server with JetStream for tests.
//
// [Start] launches a server on 127.0.0.1 with a random free port and file
// storage in a temporary (or caller-chosen) directory, waits until it accepts
// connections and shuts it down when the test ends. [Server.Restart] brings
// up a fresh server on the same port and store directory, so tests can check
// durability and client reconnection. Set NATSTEST_LOG=1 in the environment
// to see the server's log on stderr. [LogBuffer] keeps what the code under test
// logs, for a test to read.
package natstest
