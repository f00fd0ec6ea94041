package web

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
)

// secrets are what a user passes as --etcd-* flags; no response may carry
// any of them.
var secrets = []string{"/etc/weft/pki/etcd-client-key.pem", "/etc/weft/pki/etcd-client.pem", "s3cr3t-pass", "https://etcd-user:s3cr3t-pass@10.0.0.5:2379"}

// failing is a Source whose reads fail with errors that quote the
// secrets, as a TLS or dial error would.
type failing struct{}

func (failing) Snapshot(context.Context) (*Snapshot, error) {
	return nil, errors.New("etcd https://etcd-user:s3cr3t-pass@10.0.0.5:2379: open /etc/weft/pki/etcd-client-key.pem: permission denied (cert /etc/weft/pki/etcd-client.pem)")
}

func (failing) Path(context.Context, netip.Addr, netip.Addr) (*PathView, error) {
	return nil, errors.New("read leases: password s3cr3t-pass refused by https://etcd-user:s3cr3t-pass@10.0.0.5:2379")
}

// observing is a Source whose snapshot carries a node error quoting the
// key path.
type observing struct{}

func (observing) Snapshot(context.Context) (*Snapshot, error) {
	s := Build(time.Now(), "etcd", nil, []subnet.Lease{}, []Observation{{Name: "n1", Err: errors.New("tls: /etc/weft/pki/etcd-client-key.pem")}})
	return s, nil
}

func (observing) Path(context.Context, netip.Addr, netip.Addr) (*PathView, error) {
	return &PathView{Src: "10.244.1.2", Dst: "10.244.2.2"}, nil
}

func serve(t *testing.T, src Source) *httptest.Server {
	t.Helper()
	return serveWith(t, &Server{Source: src, Interval: 50 * time.Millisecond, Redact: secrets})
}

// serveWith serves s on loopback and polls its source until the test ends.
func serveWith(t *testing.T, s *Server) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(s.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.poll(ctx) }()
	t.Cleanup(func() { cancel(); <-done; ts.Close() })
	return ts
}

// get fetches path and returns the response and its body; an event
// stream is read until its first event.
func get(t *testing.T, ts *httptest.Server, path string) (*http.Response, string) {
	t.Helper()
	resp, err := ts.Client().Get(ts.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		var b strings.Builder
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() && sc.Text() != "" {
			b.WriteString(sc.Text() + "\n")
		}
		return resp, b.String()
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

var routes = []string{"/", "/index.html", "/app.js", "/app.css", "/api/snapshot", "/api/events",
	"/api/path?src=10.244.1.2&dst=10.244.2.2", "/api/path?src=bad", "/nothing"}

// TestHeaders: every response, pages, data and errors alike, carries the
// strict Content-Security-Policy and nosniff; the page's scripts and styles
// are files of the page's own origin.
func TestHeaders(t *testing.T) {
	ts := serve(t, observing{})
	for _, r := range routes {
		resp, body := get(t, ts, r)
		if got := resp.Header.Get("Content-Security-Policy"); got != CSP {
			t.Errorf("%s: Content-Security-Policy %q", r, got)
		}
		if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("%s: X-Content-Type-Options %q", r, got)
		}
		if r == "/" && (!strings.Contains(body, `<script src="app.js" defer></script>`) || strings.Contains(body, "style=")) {
			t.Errorf("the page does not load app.js as a file, or has inline style:\n%s", body)
		}
	}
	for _, want := range []string{"default-src 'self'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(CSP, want) {
			t.Errorf("CSP %q lacks %q", CSP, want)
		}
	}
	if strings.Contains(CSP, "unsafe-inline") || strings.Contains(CSP, "unsafe-eval") {
		t.Errorf("CSP allows inline code: %q", CSP)
	}
}

// TestNoSecrets: errors that quote the etcd credentials, key paths and
// endpoint reach the page without them.
func TestNoSecrets(t *testing.T) {
	for name, src := range map[string]Source{"failing": failing{}, "observing": observing{}} {
		ts := serve(t, src)
		var bodies []string
		for _, r := range routes {
			_, body := get(t, ts, r)
			bodies = append(bodies, body)
			for _, s := range append(secrets, "etcd-client", "s3cr3t") {
				if strings.Contains(body, s) {
					t.Errorf("%s %s: response holds %q:\n%s", name, r, s, body)
				}
			}
		}
		if all := strings.Join(bodies, "\n"); !strings.Contains(all, "[redacted]") {
			t.Errorf("%s: no error reached the page (the test checks nothing):\n%s", name, all)
		}
	}
}

// TestLocalOnly: without AllowRemote a client on another address, or a
// request naming another host (DNS rebinding), is refused.
func TestLocalOnly(t *testing.T) {
	for _, c := range []struct {
		remote, host string
		allow        bool
		want         int
	}{
		{"127.0.0.1:5000", "127.0.0.1:9471", false, 200},
		{"[::1]:5000", "localhost:9471", false, 200},
		{"192.0.2.7:5000", "127.0.0.1:9471", false, 403},
		{"127.0.0.1:5000", "weft.example:9471", false, 403},
		{"192.0.2.7:5000", "weft.example:9471", true, 200},
	} {
		s := &Server{Source: observing{}, AllowRemote: c.allow}
		req := httptest.NewRequest("GET", "/app.css", nil)
		req.RemoteAddr, req.Host = c.remote, c.host
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, req)
		if w.Code != c.want {
			t.Errorf("client %s, host %s, allow %t: status %d, want %d", c.remote, c.host, c.allow, w.Code, c.want)
		}
	}
}

// TestLocalOnlyOverTCP: a server listening on a non-loopback address
// (in a test namespace) without AllowRemote answers a client that reaches
// it there with 403, and the page with AllowRemote.
func TestLocalOnlyOverTCP(t *testing.T) {
	ns := nettest.NewNS(t, "web")
	addr := netip.MustParsePrefix("192.0.2.1/32")
	if err := namespace.AddAddr(ns, "lo", addr); err != nil {
		t.Fatal(err)
	}
	for _, allow := range []bool{false, true} {
		ln, err := ns.Listen("tcp", "192.0.2.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{Source: observing{}, Interval: time.Second, AllowRemote: allow}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx, ln) }()
		code, _, err := ns.HTTPGet("http://" + ln.Addr().String() + "/")
		cancel()
		<-done
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{false: 403, true: 200}[allow]; code != want {
			t.Errorf("AllowRemote %t: a client at 192.0.2.1 got %d, want %d", allow, code, want)
		}
	}
}

func TestCheckListen(t *testing.T) {
	for _, c := range []struct {
		addr     string
		explicit bool
		ok       bool
	}{
		{"127.0.0.1:9471", false, true},
		{"[::1]:9471", false, true},
		{"localhost:9471", false, true},
		{"0.0.0.0:9471", false, false},
		{":9471", false, false},
		{"192.0.2.1:9471", false, false},
		{"0.0.0.0:9471", true, true},
		{"127.0.0.1", false, false},
	} {
		if err := CheckListen(c.addr, c.explicit); (err == nil) != c.ok {
			t.Errorf("CheckListen(%q, %t) = %v, want ok %t", c.addr, c.explicit, err, c.ok)
		}
	}
}
