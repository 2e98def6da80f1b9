package metrics

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natstone/natstone/kv"
)

// DefaultHealthTimeout bounds a health check unless HealthConfig.Timeout says otherwise.
const DefaultHealthTimeout = 2 * time.Second

// The statuses of a HealthReport.
const (
	StatusOK          = "ok"          // every check passed: HTTP 200
	StatusUnavailable = "unavailable" // a check failed: HTTP 503
)

// HealthConfig configures Health and CheckHealth.
type HealthConfig struct {
	// Conn is the connection to check: the one the broker stores through. Without it every check
	// fails.
	Conn *nats.Conn
	// StorePrefix names the buckets and streams to check, as broker.Config.StorePrefix. Default
	// kv.DefaultPrefix ("natstone").
	StorePrefix string
	// Events checks the events stream <StorePrefix>-events too: set it when the broker publishes
	// events.
	Events bool
	// Timeout bounds the whole check, whatever NATS does. Default DefaultHealthTimeout.
	Timeout time.Duration
}

// HealthReport is the outcome of a health check, and the JSON body the Health handler answers.
type HealthReport struct {
	Status string        `json:"status"` // StatusOK or StatusUnavailable
	Checks []HealthCheck `json:"checks"` // every check, in a fixed order
}

// HealthCheck is the outcome of one check. Name is "nats", "jetstream", "bucket:<name>" or
// "stream:<name>".
type HealthCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// Health returns an HTTP handler, to mount at /healthz, that runs CheckHealth on every GET (or
// HEAD) and answers its report as JSON: 200 if every check passed, else 503. Other methods get 405.
func Health(cfg HealthConfig) http.Handler {
	return probe(func(r *http.Request) (bool, any) {
		rep := CheckHealth(r.Context(), cfg)
		return rep.Status == StatusOK, rep
	})
}

// Ready returns an HTTP handler, to mount at /readyz, that answers whether the broker serves
// (serving, as broker.Broker.Serving): 200 and {"status":"serving"} if it does, else 503 and
// {"status":"not_serving"} (a standby, a broker recovering, or one cut off from its claim on the
// store). It asks NATS nothing. Unlike /healthz, which says whether the storage a broker needs is
// there, it says whether this broker answers requests: point a load balancer's or an orchestrator's
// readiness probe at it. Other methods than GET and HEAD get 405.
func Ready(serving func() bool) http.Handler {
	return probe(func(*http.Request) (bool, any) {
		if serving() {
			return true, readyReport{Status: "serving"}
		}
		return false, readyReport{Status: "not_serving"}
	})
}

// readyReport is the body of /readyz.
type readyReport struct {
	Status string `json:"status"`
}

// probe is a GET (or HEAD) handler answering what check says as JSON, 200 if it says ok, else
// 503, never cached. Other methods get 405.
func probe(check func(*http.Request) (ok bool, report any)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		ok, report := check(r)
		body, err := json.Marshal(report)
		if err != nil {
			http.Error(w, fmt.Sprintf("metrics: encode %T: %v", report, err), http.StatusInternalServerError)
			return
		}
		status := http.StatusOK
		if !ok {
			status = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(status)
		_, _ = w.Write(append(body, '\n'))
	})
}

// CheckHealth checks, within cfg.Timeout (or ctx's deadline, if sooner), that cfg.Conn is
// connected, that JetStream answers for its account, and that the buckets <prefix>-queues,
// <prefix>-messages, <prefix>-locks, <prefix>-schedules and <prefix>-claims (whose renewals stop
// the queues when it has no leader) and the streams <prefix>-bodies (and <prefix>-events with
// cfg.Events) exist and have a leader and a quorum of current replicas. A check that cannot run
// because an earlier one failed fails as skipped.
func CheckHealth(ctx context.Context, cfg HealthConfig) HealthReport {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(cfg.Timeout, DefaultHealthTimeout))
	defer cancel()
	streams := storeStreams(cmp.Or(cfg.StorePrefix, kv.DefaultPrefix), cfg.Events)

	conn := checkConn(cfg.Conn)
	if !conn.OK {
		return report(append([]HealthCheck{conn, skipped("jetstream", "NATS not connected")},
			skippedStreams(streams, "NATS not connected")...))
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return report(append([]HealthCheck{conn, failed("jetstream", err)}, skippedStreams(streams, "no JetStream")...))
	}
	account := checkAccount(ctx, js)
	if !account.OK {
		return report(append([]HealthCheck{conn, account}, skippedStreams(streams, "JetStream unavailable")...))
	}
	return report(append([]HealthCheck{conn, account}, checkStreams(ctx, js, streams)...))
}

// storeStream is a stream to check, under the name its check carries.
type storeStream struct {
	check  string // "bucket:<bucket>" or "stream:<stream>"
	stream string // the JetStream stream name
}

// storeStreams lists the buckets and streams of a store with prefix.
func storeStreams(prefix string, events bool) []storeStream {
	var ss []storeStream
	for _, name := range []string{"queues", "messages", "locks", "schedules", "claims"} {
		bucket := prefix + "-" + name
		ss = append(ss, storeStream{check: "bucket:" + bucket, stream: "KV_" + bucket})
	}
	names := []string{prefix + "-bodies"}
	if events {
		names = append(names, prefix+"-events")
	}
	for _, name := range names {
		ss = append(ss, storeStream{check: "stream:" + name, stream: name})
	}
	return ss
}

// report sums checks up.
func report(checks []HealthCheck) HealthReport {
	rep := HealthReport{Status: StatusOK, Checks: checks}
	for _, c := range checks {
		if !c.OK {
			rep.Status = StatusUnavailable
		}
	}
	return rep
}

// checkConn checks that nc is connected (not closed, reconnecting or draining).
func checkConn(nc *nats.Conn) HealthCheck {
	switch {
	case nc == nil:
		return HealthCheck{Name: "nats", Detail: "no connection configured"}
	case !nc.IsConnected():
		return HealthCheck{Name: "nats", Detail: "connection " + nc.Status().String()}
	default:
		return HealthCheck{Name: "nats", OK: true, Detail: "connected to server " + nc.ConnectedServerName()}
	}
}

// checkAccount checks that JetStream answers an account info request.
func checkAccount(ctx context.Context, js jetstream.JetStream) HealthCheck {
	info, err := js.AccountInfo(ctx)
	if err != nil {
		return failed("jetstream", fmt.Errorf("account info: %w", err))
	}
	return HealthCheck{Name: "jetstream", OK: true, Detail: fmt.Sprintf("%d streams", info.Streams)}
}

// checkStreams checks every stream at once, so that all of them together take no longer than ctx
// allows.
func checkStreams(ctx context.Context, js jetstream.JetStream, streams []storeStream) []HealthCheck {
	checks := make([]HealthCheck, len(streams))
	var wg sync.WaitGroup
	for i, s := range streams {
		wg.Go(func() { checks[i] = checkStream(ctx, js, s) })
	}
	wg.Wait()
	return checks
}

// checkStream checks that s exists and can take writes.
func checkStream(ctx context.Context, js jetstream.JetStream, s storeStream) HealthCheck {
	st, err := js.Stream(ctx, s.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return HealthCheck{Name: s.check, Detail: "not found"}
	}
	if err != nil {
		return failed(s.check, fmt.Errorf("stream info %s: %w", s.stream, err))
	}
	ok, detail := streamHealth(st.CachedInfo())
	return HealthCheck{Name: s.check, OK: ok, Detail: detail}
}

// streamHealth judges a stream's info: a replicated stream needs a leader and a quorum of current
// replicas (the leader included) to take writes.
func streamHealth(info *jetstream.StreamInfo) (ok bool, detail string) {
	msgs := fmt.Sprintf("%d messages", info.State.Msgs)
	if info.Config.Replicas <= 1 || info.Cluster == nil {
		return true, msgs
	}
	if info.Cluster.Leader == "" {
		return false, msgs + ", no leader"
	}
	current := 1
	for _, p := range info.Cluster.Replicas {
		if p.Current && !p.Offline {
			current++
		}
	}
	detail = fmt.Sprintf("%s, leader %s, %d of %d replicas current", msgs, info.Cluster.Leader, current, info.Config.Replicas)
	return current > info.Config.Replicas/2, detail
}

// failed is a failed check that says err.
func failed(name string, err error) HealthCheck {
	return HealthCheck{Name: name, Detail: err.Error()}
}

// skipped is a failed check that did not run because of why.
func skipped(name, why string) HealthCheck {
	return HealthCheck{Name: name, Detail: "skipped: " + why}
}

// skippedStreams is a skipped check per stream.
func skippedStreams(streams []storeStream, why string) []HealthCheck {
	checks := make([]HealthCheck, len(streams))
	for i, s := range streams {
		checks[i] = skipped(s.check, why)
	}
	return checks
}
