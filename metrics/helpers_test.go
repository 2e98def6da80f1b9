package metrics_test

import (
	"context"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/natstone/natstone/broker"
	"github.com/natstone/natstone/test/natstest"
)

// deadline bounds every wait in these tests.
const deadline = 30 * time.Second

// testContext returns a context that ends at the test's deadline.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	t.Cleanup(cancel)
	return ctx
}

// startBroker starts a broker on srv with cfg (its Conn and Logger set here) and stops it when the
// test ends.
func startBroker(t *testing.T, srv *natstest.Server, cfg *broker.Config) *broker.Broker {
	t.Helper()
	cfg.Conn = srv.Connect(t)
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	if err := b.Start(testContext(t)); err != nil {
		t.Fatalf("start broker: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Errorf("stop broker: %v", err)
		}
	})
	return b
}

// connectWithoutJetStream starts a nats-server without JetStream (which natstest cannot do; turning
// JetStream off on a running server races with the server's own API workers) and returns a
// connection to it. Both end with the test.
func connectWithoutJetStream(t *testing.T) *nats.Conn {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	ns.Start()
	if !ns.ReadyForConnections(deadline) {
		t.Fatalf("nats-server not ready after %v", deadline)
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// families is one scrape, parsed: metric families by name.
type families map[string]*dto.MetricFamily

// scrape serves one GET of h (the text format: no Accept header) and parses its body.
func scrape(t *testing.T, h http.Handler) families {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", http.NoBody))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: status %d, body:\n%s", rec.Code, rec.Body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("scrape: parse: %v", err)
	}
	return fams
}

// family returns the family name, failing the test if it is absent or not of type typ.
func (f families) family(t *testing.T, name string, typ dto.MetricType) *dto.MetricFamily {
	t.Helper()
	fam, ok := f[name]
	if !ok {
		t.Fatalf("no metric family %s in the scrape", name)
	}
	if fam.GetType() != typ {
		t.Fatalf("%s is a %v, want a %v", name, fam.GetType(), typ)
	}
	return fam
}

// metric returns name's metric with exactly the label pairs labels ("k=v" each), failing the test
// if there is none.
func (f families) metric(t *testing.T, name string, typ dto.MetricType, labels ...string) *dto.Metric {
	t.Helper()
	want := labelSet(labels)
	for _, m := range f.family(t, name, typ).GetMetric() {
		if labelsOf(m) == want {
			return m
		}
	}
	t.Fatalf("no %s{%s}; have %v", name, want, f.labelSets(t, name, typ))
	return nil
}

// counter returns the value of a counter.
func (f families) counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return f.metric(t, name, dto.MetricType_COUNTER, labels...).GetCounter().GetValue()
}

// gauge returns the value of a gauge.
func (f families) gauge(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return f.metric(t, name, dto.MetricType_GAUGE, labels...).GetGauge().GetValue()
}

// histogram returns a histogram.
func (f families) histogram(t *testing.T, name string, labels ...string) *dto.Histogram {
	t.Helper()
	return f.metric(t, name, dto.MetricType_HISTOGRAM, labels...).GetHistogram()
}

// labelSets returns the label sets of name's metrics, sorted, each as labelSet gives it.
func (f families) labelSets(t *testing.T, name string, typ dto.MetricType) []string {
	t.Helper()
	var sets []string
	for _, m := range f.family(t, name, typ).GetMetric() {
		sets = append(sets, labelsOf(m))
	}
	slices.Sort(sets)
	return sets
}

// labelsOf returns m's labels as labelSet gives them.
func labelsOf(m *dto.Metric) string {
	pairs := make([]string, 0, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		pairs = append(pairs, l.GetName()+"="+l.GetValue())
	}
	return labelSet(pairs)
}

// labelSet returns "k=v" pairs sorted and joined with commas: one string per label set.
func labelSet(pairs []string) string {
	pairs = slices.Clone(pairs)
	slices.Sort(pairs)
	return strings.Join(pairs, ",")
}

// bucket returns the cumulative count of h's bucket with upper bound le.
func bucket(t *testing.T, h *dto.Histogram, le float64) uint64 {
	t.Helper()
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == le {
			return b.GetCumulativeCount()
		}
	}
	t.Fatalf("no bucket le=%v in %v", le, h.GetBucket())
	return 0
}

// near reports whether a and b are equal but for floating-point rounding.
func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }
