package natstest

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ChangeObjectByte changes, in the only chunk of object name of the object store bucket, the first
// byte of the last place where find stands to to, keeping the object's meta and so its digest: a
// read of the object then fails its digest check at its end. It fails the test if find is not in
// the chunk.
func ChangeObjectByte(t testing.TB, js jetstream.JetStream, bucket, name string, find []byte, to byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	obs, err := js.ObjectStore(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := obs.GetInfo(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if info.Chunks != 1 {
		t.Fatalf("object %s/%s has %d chunks, want 1", bucket, name, info.Chunks)
	}
	st, err := js.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	subject := "$O." + bucket + ".C." + info.NUID
	chunk, err := st.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Clone(chunk.Data)
	at := bytes.LastIndex(data, find)
	if at < 0 {
		t.Fatalf("%q not found in object %s/%s", find, bucket, name)
	}
	data[at] = to
	if err := st.DeleteMsg(ctx, chunk.Sequence); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, subject, data); err != nil {
		t.Fatal(err)
	}
}
