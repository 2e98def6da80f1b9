package broker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestAckWaitsEndAtTheirStreamsElection: the waits of message writes for their acknowledgements
// end (for the writes to be issued again) when the messages stream elects a leader, and those of
// lock writes when the locks stream does; each election ends the waits begun before it, and only
// its own stream's. TestLeaderElectionInAClusterIssuesLostWritesAgain has a real election; here
// the advisory is the test's.
func TestAckWaitsEndAtTheirStreamsElection(t *testing.T) {
	t.Parallel()
	b, _ := internalBroker(t)
	messages, locks := b.store.RecordStreams()
	for _, tc := range []struct {
		stream      string
		ends, stays *ackWatch
	}{
		{messages, b.msgAcks, b.lockAcks},
		{locks, b.lockAcks, b.msgAcks},
	} {
		waiting, other := tc.ends.current(), tc.stays.current()
		if err := b.cfg.Conn.Publish(leaderElected(tc.stream), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-waiting.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("%s's election: the waits did not end", tc.stream)
		}
		if err := context.Cause(waiting); !errors.Is(err, errAcksLost) || !strings.Contains(err.Error(), tc.stream+" elected a leader") {
			t.Fatalf("%s's election: the waits ended with %v, want %v naming the stream", tc.stream, err, errAcksLost)
		}
		if tc.ends.current().Err() != nil {
			t.Fatalf("%s's election: the waits begun after it ended too", tc.stream)
		}
		if other.Err() != nil {
			t.Fatalf("%s's election ended the other stream's waits", tc.stream)
		}
	}
}
