package metrics_test

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/natstone/natstone/metrics"
	"github.com/natstone/natstone/subjects"
)

// Example counts what a broker would report (set m as broker.Config.Observer and call
// m.Watch(b.Snapshot) for the real thing) and shows the lines of one scrape about enqueue.
func Example() {
	m := metrics.New()
	m.Request(subjects.OpEnqueue, "", 3*time.Millisecond)
	m.Request(subjects.OpEnqueue, subjects.CodeQueueBlocked, time.Millisecond)

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", http.NoBody))
	lines := bufio.NewScanner(rec.Body)
	for lines.Scan() {
		if l := lines.Text(); strings.HasPrefix(l, "natstone_requests_total{") && strings.Contains(l, `op="enqueue"`) {
			fmt.Println(l)
		}
	}
	// Output:
	// natstone_requests_total{code="ok",op="enqueue"} 1
	// natstone_requests_total{code="queue_blocked",op="enqueue"} 1
}
