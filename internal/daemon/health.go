package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// HealthServer serves /healthz (the process answers), /readyz (the subnet
// file is written, the dataplane programmed and, with --network-policy, the
// last policy transaction committed) and whatever else is mounted
// on Mux (for example /metrics).
type HealthServer struct {
	Addr  string
	Ready func() bool
	// Why, if set, says what readiness waits for; /readyz adds it to its
	// answer when not ready.
	Why func() string
	Mux *http.ServeMux
	Log *slog.Logger
}

// NewHealthServer returns a server for addr whose readiness is ready().
func NewHealthServer(addr string, ready func() bool, log *slog.Logger) *HealthServer {
	s := &HealthServer{Addr: addr, Ready: ready, Mux: http.NewServeMux(), Log: log.With("component", "health")}
	s.Mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	s.Mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.Ready() {
			msg := "not ready: waiting for the lease, the subnet file, the dataplane and (with --network-policy) a committed network policy table"
			if s.Why != nil {
				if why := s.Why(); why != "" {
					msg += ": " + why
				}
			}
			http.Error(w, msg, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return s
}

// Run listens until ctx is done.
func (s *HealthServer) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return fmt.Errorf("health server: %w", err)
	}
	s.Log.Info("serving health and metrics", "addr", ln.Addr().String())
	srv := &http.Server{Handler: s.Mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("health server: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	srv.Shutdown(shutdownCtx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("health server: %w", err)
	}
	return nil
}
