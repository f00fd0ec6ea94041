package web

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

//go:embed static
var static embed.FS

// CSP allows the page's own files and nothing else: no inline script or
// style, no other origin, no framing.
const CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Server serves the page, its files, /api/events (server-sent events, one
// Snapshot as JSON every Interval), /api/snapshot, /api/path and
// /api/flows.
type Server struct {
	Source   Source
	Interval time.Duration // 1s when zero
	Log      *slog.Logger
	// AllowRemote serves clients on other hosts too; when false, only
	// loopback clients that name a loopback host are answered (403
	// otherwise, which also stops a DNS-rebinding page).
	AllowRemote bool
	// Redact are strings no response may carry (etcd credentials, key
	// and certificate paths, endpoints and their parts: EndpointSecrets):
	// each is replaced by "[redacted]" in every error text sent, the only
	// place where they could appear (the rest is leases and kernel state).
	Redact []string
	// Flows, if set, feeds the flows panel (/api/flows).
	Flows Flows

	mu      sync.Mutex
	last    []byte        // the latest snapshot, JSON
	lastErr string        // the last read error logged (each is logged once in a row)
	next    chan struct{} // closed when last is replaced
}

// CheckListen refuses an address that is not loopback unless remote is
// set (--listen given explicitly by the user).
func CheckListen(addr string, remote bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if loopbackHost(host) || remote {
		return nil
	}
	return fmt.Errorf("listen address %q: not a loopback address; the page shows the cluster's layout to whoever reaches it, so pass --listen %s explicitly to serve it beyond this machine", addr, addr)
}

// loopbackHost reports whether hostport (or a bare host) names loopback.
func loopbackHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = strings.Trim(hostport, "[]")
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// Handler returns the page's routes.
func (s *Server) Handler() http.Handler {
	files, _ := fs.Sub(static, "static")
	mux := http.NewServeMux()
	mux.Handle("GET /", http.FileServerFS(files))
	mux.HandleFunc("GET /api/snapshot", s.snapshot)
	mux.HandleFunc("GET /api/events", s.events)
	mux.HandleFunc("GET /api/path", s.path)
	mux.HandleFunc("GET /api/flows", s.flows)
	return s.headers(mux)
}

// headers sets the security headers on every response and refuses
// non-local clients unless AllowRemote.
func (s *Server) headers(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.AllowRemote && (!loopbackHost(r.RemoteAddr) || !loopbackHost(r.Host)) {
			http.Error(w, "weftctl web answers only this machine (start it with an explicit --listen to serve others)", http.StatusForbidden)
			return
		}
		hd := w.Header()
		hd.Set("Content-Security-Policy", CSP)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

// Run serves on ln until ctx ends, reading a snapshot every Interval.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	if s.Interval == 0 {
		s.Interval = time.Second
	}
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	done := make(chan struct{})
	go func() { defer close(done); s.poll(ctx) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	hs.Shutdown(sctx)
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// poll reads a snapshot every Interval and wakes the event streams.
func (s *Server) poll(ctx context.Context) {
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		s.refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) refresh(ctx context.Context) {
	snap, err := s.Source.Snapshot(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if err.Error() != s.lastErr {
			s.log().Warn("read the overlay", "err", err)
		}
		s.lastErr = err.Error()
		snap = &Snapshot{Time: time.Now(), Nodes: []Node{}, Links: []Link{}, Rejected: []Rejected{}, Errors: []string{err.Error()}}
	}
	if err == nil {
		s.lastErr = ""
	}
	for i, e := range snap.Errors {
		snap.Errors[i] = s.scrub(e)
	}
	for i := range snap.Nodes {
		snap.Nodes[i].Error = s.scrub(snap.Nodes[i].Error)
	}
	b, err := json.Marshal(snap)
	if err != nil {
		s.log().Error("encode snapshot", "err", err)
		return
	}
	s.mu.Lock()
	s.last = b
	if s.next != nil {
		close(s.next)
	}
	s.next = make(chan struct{})
	s.mu.Unlock()
}

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

// latest returns the last snapshot and a channel closed when a newer one
// is there.
func (s *Server) latest() ([]byte, chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.next == nil {
		s.next = make(chan struct{})
	}
	return s.last, s.next
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) {
	b, next := s.latest()
	if b == nil {
		select {
		case <-next:
			b, _ = s.latest()
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for {
		b, next := s.latest()
		if b != nil {
			if _, err := fmt.Fprintf(w, "event: snapshot\ndata: %s\n\n", b); err != nil {
				return
			}
			fl.Flush()
		}
		select {
		case <-next:
		case <-r.Context().Done():
			return
		}
	}
}

func (s *Server) path(w http.ResponseWriter, r *http.Request) {
	src, err := netip.ParseAddr(r.URL.Query().Get("src"))
	if err != nil {
		s.jsonError(w, http.StatusBadRequest, fmt.Errorf("source: %w", err))
		return
	}
	dst, err := netip.ParseAddr(r.URL.Query().Get("dst"))
	if err != nil {
		s.jsonError(w, http.StatusBadRequest, fmt.Errorf("destination: %w", err))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	p, err := s.Source.Path(ctx, src, dst)
	if err != nil {
		s.jsonError(w, http.StatusUnprocessableEntity, err)
		return
	}
	b, err := json.Marshal(p)
	if err != nil {
		s.jsonError(w, http.StatusInternalServerError, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

func (s *Server) jsonError(w http.ResponseWriter, code int, err error) {
	b, _ := json.Marshal(map[string]string{"error": s.scrub(err.Error())})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(b)
}

// scrub replaces every Redact string in text, the longest first where two
// start at the same place (an endpoint before its host).
func (s *Server) scrub(text string) string {
	rs := slices.Clone(s.Redact)
	slices.SortStableFunc(rs, func(a, b string) int { return len(b) - len(a) })
	var pairs []string
	for _, r := range rs {
		if r != "" {
			pairs = append(pairs, r, "[redacted]")
		}
	}
	return strings.NewReplacer(pairs...).Replace(text)
}
