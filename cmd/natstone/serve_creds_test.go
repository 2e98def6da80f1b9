package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/natstone/natstone/test/natstest"
)

// operatorServer starts a nats-server in operator mode, as NGS, Synadia Cloud and nsc-managed
// systems run: one account, with JetStream, whose users log in with credentials files; with
// maxBytesRequired, the account takes only streams that declare a size, as Synadia Cloud's do. It
// returns the server's URL and a credentials file of a user of that account.
func operatorServer(t *testing.T, maxBytesRequired bool) (url, creds string) {
	t.Helper()
	operator, sys, account, user := newKeys(t, nkeys.CreateOperator), newKeys(t, nkeys.CreateAccount), newKeys(t, nkeys.CreateAccount), newKeys(t, nkeys.CreateUser)
	opPub, sysPub, accPub, userPub := publicKey(t, operator), publicKey(t, sys), publicKey(t, account), publicKey(t, user)

	opClaims := jwt.NewOperatorClaims(opPub)
	opClaims.SystemAccount = sysPub // JetStream needs the system account
	opJWT, err := opClaims.Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	sysJWT, err := jwt.NewAccountClaims(sysPub).Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	accClaims := jwt.NewAccountClaims(accPub)
	accClaims.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1, MaxBytesRequired: maxBytesRequired}
	accJWT, err := accClaims.Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	userJWT, err := jwt.NewUserClaims(userPub).Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := user.Seed()
	if err != nil {
		t.Fatal(err)
	}
	file, err := jwt.FormatUserConfig(userJWT, seed)
	if err != nil {
		t.Fatal(err)
	}
	creds = filepath.Join(t.TempDir(), "natstone.creds")
	if err := os.WriteFile(creds, file, 0o600); err != nil {
		t.Fatal(err)
	}

	opc, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		t.Fatal(err)
	}
	resolver := &server.MemAccResolver{}
	for pub, claims := range map[string]string{sysPub: sysJWT, accPub: accJWT} {
		if err := resolver.Store(pub, claims); err != nil {
			t.Fatal(err)
		}
	}
	srv := natstest.StartOptions(t, &server.Options{
		TrustedOperators: []*jwt.OperatorClaims{opc}, AccountResolver: resolver, SystemAccount: sysPub,
	})
	return srv.URL(), creds
}

func newKeys(t *testing.T, create func() (nkeys.KeyPair, error)) nkeys.KeyPair {
	t.Helper()
	kp, err := create()
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func publicKey(t *testing.T, kp nkeys.KeyPair) string {
	t.Helper()
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// TestServeWithCreds: natstone serve logs in to an operator-mode server with --nats-creds and
// serves there, its dashboard's connection too. Without them the server refuses it.
func TestServeWithCreds(t *testing.T) {
	t.Parallel()
	url, creds := operatorServer(t, false)

	p := startProc(t, "serve", "--nats-url", url)
	if c := p.wait(t); c != exitError || !strings.Contains(p.log.String(), "Authorization Violation") {
		t.Fatalf("serve without credentials: exit code %d, want %d with an authorization violation:\n%s", c, exitError, p.log)
	}

	ready, _, _ := inProcess(t, "--nats-url", url, "--nats-creds", creds, "--http", "127.0.0.1:0", "--log-format", "json")
	var line struct {
		HTTP string `json:"http"`
	}
	if err := json.Unmarshal([]byte(ready), &line); err != nil || line.HTTP == "" {
		t.Fatalf("ready line %s (%v): want the HTTP listener's address", ready, err)
	}
	cli(t, url, "queue", "create", "q", "--creds", creds).ok(t)
	cli(t, url, "enqueue", "q", "--id", "m1", "--creds", creds, "hello").ok(t)
	if status, body := httpGet(t, "http://"+line.HTTP+"/api/queues"); status != http.StatusOK || !strings.Contains(body, `"q"`) {
		t.Fatalf("GET /api/queues through the dashboard's own connection: %d %s; want queue q", status, body)
	}
}

// TestServeWhereStreamsMustDeclareASize: an account that takes only streams of a declared size (as
// Synadia Cloud's) refuses natstone's buckets unless --store-max-bytes gives them one; with it,
// natstone serves, and every stream of its store declares a size.
func TestServeWhereStreamsMustDeclareASize(t *testing.T) {
	t.Parallel()
	url, creds := operatorServer(t, true)

	p := startProc(t, "serve", "--nats-url", url, "--nats-creds", creds)
	if c := p.wait(t); c != exitError || !strings.Contains(p.log.String(), "max bytes") {
		t.Fatalf("serve without --store-max-bytes: exit code %d, want %d, refused for max bytes:\n%s", c, exitError, p.log)
	}

	inProcess(t, "--nats-url", url, "--nats-creds", creds, "--store-max-bytes", "67108864")
	cli(t, url, "queue", "create", "q", "--creds", creds).ok(t)
	cli(t, url, "enqueue", "q", "--id", "m1", "--creds", creds, "hello").ok(t)
	nc, err := nats.Connect(url, nats.UserCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	names := js.StreamNames(ctx)
	n := 0
	for name := range names.Name() {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.CachedInfo().Config.MaxBytes; got <= 0 {
			t.Errorf("stream %s: max_bytes %d, want a size", name, got)
		}
		n++
	}
	if err := names.Err(); err != nil || n < 8 {
		t.Fatalf("listed %d streams (%v), want natstone's eight", n, err)
	}
}
