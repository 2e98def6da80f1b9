package web

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/natstone/natstone/subjects"
	"github.com/natstone/natstone/workers"
)

// MaxPayloadPreview is the largest payload the message route includes; a larger one is reported by
// its size only, so that a page never pulls half a megabyte per refresh.
const MaxPayloadPreview = 4 << 10

// maxBodyBytes bounds the body of a POST.
const maxBodyBytes = 1 << 10

// contentSecurityPolicy allows the dashboard to load its own files and call its own API, and nothing
// else: no inline script or style, no other origin, no framing.
const contentSecurityPolicy = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

//go:embed static
var static embed.FS

// Config configures a Server.
type Config struct {
	// Client asks the broker. Required.
	Client *workers.Client
	// Metrics, if set, is served at GET /metrics.
	Metrics http.Handler
	// Health, if set, is served at GET /healthz.
	Health http.Handler
	// Ready, if set, is served at GET /readyz.
	Ready http.Handler
	// Logger receives the changes of blocked flags (level info) and the requests the broker did not
	// answer (level warn). Default slog.Default().
	Logger *slog.Logger
	// Hosts, if set, are the host names (without port, case-insensitive) that a request's Host
	// header may name; others get 421 Misdirected Request. For a listener on a loopback address,
	// the loopback names: a page of another site whose name an attacker made resolve to 127.0.0.1
	// (DNS rebinding) is then not answered, though to the browser it is same-origin.
	Hosts []string
	// AnyIP, with Hosts set, also allows every Host that is an IP address: DNS rebinding needs a
	// name, so a listener reached by its addresses is safe with only the names it is known by in
	// Hosts.
	AnyIP bool
}

// Server is the HTTP side of natstone: the JSON API and the dashboard. It is safe for concurrent
// use and holds no state besides its config.
type Server struct {
	client  *workers.Client
	log     *slog.Logger
	handler http.Handler
}

// New returns a Server for cfg. It fails if cfg.Client is nil.
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil {
		return nil, errors.New("natstone: web Config.Client is required")
	}
	s := &Server{client: cfg.Client, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	files, err := fs.Sub(static, "static")
	if err != nil {
		return nil, fmt.Errorf("natstone: web: embedded files: %w", err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/queues", s.api(s.listQueues))
	mux.HandleFunc("GET /api/queues/{name}", s.api(s.getQueue))
	mux.HandleFunc("GET /api/queues/{name}/messages", s.api(s.listMessages))
	mux.HandleFunc("GET /api/queues/{name}/messages/{id}", s.api(s.getMessage))
	mux.HandleFunc("GET /api/queues/{name}/message", s.api(s.getMessage))
	mux.HandleFunc("POST /api/queues/{name}/blocked", s.api(s.setBlocked))
	mux.HandleFunc("POST /api/queues/{name}/retry", s.api(s.retryMessage))
	mux.HandleFunc("POST /api/queues/{name}/reschedule", s.api(s.rescheduleMessage))
	mux.HandleFunc("POST /api/queues/{name}/cancel", s.api(s.cancelMessage))
	mux.HandleFunc("POST /api/queues/{name}/schedules/{schedule}/pause", s.api(s.pauseSchedule))
	mux.HandleFunc("POST /api/queues/{name}/schedules/{schedule}/resume", s.api(s.resumeSchedule))
	mux.HandleFunc("POST /api/queues/{name}/schedules/{schedule}/fire", s.api(s.fireSchedule))
	if cfg.Metrics != nil {
		mux.Handle("GET /metrics", cfg.Metrics)
	}
	if cfg.Health != nil {
		mux.Handle("GET /healthz", cfg.Health)
	}
	if cfg.Ready != nil {
		mux.Handle("GET /readyz", cfg.Ready)
	}
	// The dashboard's files one by one rather than "GET /", so that an unknown path is a 404 and a
	// GET of a POST route a 405.
	dash := dashboard(http.FileServerFS(files))
	mux.Handle("GET /{$}", dash)
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, fmt.Errorf("natstone: web: embedded files: %w", err)
	}
	for _, f := range entries {
		if f.Name() != "index.html" { // served at "/" only: /index.html is a 404
			mux.Handle("GET /"+f.Name(), dash)
		}
	}
	// Cross-origin POSTs are refused (Sec-Fetch-Site, else Origin against Host): a page of another
	// origin cannot toggle a queue's flags through the user's browser.
	origins := http.NewCrossOriginProtection()
	origins.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusForbidden, errorReply{Error: subjects.Error{Code: subjects.CodeBadRequest,
			Message: "cross-origin request refused: this dashboard's POSTs come from its own pages, or from clients that send no Origin (curl)"}})
	}))
	s.handler = secure(allowHosts(cfg.Hosts, cfg.AnyIP, isolate(origins.Handler(mux))))
	return s, nil
}

// isolate refuses what a browser sends on behalf of a page of another site (Fetch Metadata:
// Sec-Fetch-Site "cross-site" or "same-site"), unless it is a link the user followed (a top-level
// navigation with user activation: Sec-Fetch-User). The cross-origin POSTs are refused anyway; this
// stops the GETs: a page of any site could otherwise make the browsers of the people who read it
// call the API, /metrics and /healthz on their loopback dashboard, without end (with fetches,
// images, frames, or a window it opened and navigates again and again): it could not read the
// replies, but each /api/queues of 1,000 queues costs the broker 1,000 stats. Clients that are not
// browsers send no Sec-Fetch-Site, and the dashboard's own pages send "same-origin".
func isolate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("Sec-Fetch-Site") {
		case "cross-site", "same-site":
			h := r.Header
			if r.Method != http.MethodGet || h.Get("Sec-Fetch-Mode") != "navigate" || h.Get("Sec-Fetch-Dest") != "document" || h.Get("Sec-Fetch-User") != "?1" {
				writeJSON(w, http.StatusForbidden, errorReply{Error: subjects.Error{Code: subjects.CodeBadRequest,
					Message: "cross-site request refused: a page of another site may link to this dashboard, not call it"}})
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// allowHosts answers only requests whose Host names one of hosts, or with anyIP is an IP address
// (all of them if hosts is empty). A request without a Host (HTTP/1.0, a load balancer's health
// check) comes from no browser, and /metrics, /healthz and /readyz are for machines that scrape them by
// whatever name they know the listener by: those are answered whatever the Host.
func allowHosts(hosts []string, anyIP bool, next http.Handler) http.Handler {
	if len(hosts) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		host = strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ".")
		_, ipErr := netip.ParseAddr(host) // zones (fe80::1%eth0) included
		if host == "" || anyIP && ipErr == nil || r.URL.Path == "/metrics" || r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			next.ServeHTTP(w, r)
			return
		}
		if !slices.ContainsFunc(hosts, func(h string) bool { return strings.EqualFold(h, host) }) {
			writeJSON(w, http.StatusMisdirectedRequest, errorReply{Error: subjects.Error{Code: subjects.CodeBadRequest,
				Message: fmt.Sprintf("this dashboard does not answer to host %q (natstone serve --http-host NAME adds a name)", r.Host)}})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Handler returns the handler of every route: the API under /api/, the dashboard at /, and
// /metrics, /healthz and /readyz when configured.
func (s *Server) Handler() http.Handler { return s.handler }

// secure sets the headers that keep every response to its own origin.
func secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		next.ServeHTTP(w, r)
	})
}

// dashboard serves the embedded files. They have no modification time, so the browser is told to
// revalidate rather than keep a dashboard older than the binary.
func dashboard(files http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
