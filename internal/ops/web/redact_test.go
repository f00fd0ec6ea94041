package web

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

func TestEndpointSecrets(t *testing.T) {
	got := EndpointSecrets("http://127.0.0.1:2379, https://etcd-user:s3cr%40t@etcd.example:2379,unix:///run/etcd.sock,unix://rel.sock:0")
	for _, want := range []string{
		"http://127.0.0.1:2379", "127.0.0.1:2379", "127.0.0.1",
		"https://etcd-user:s3cr%40t@etcd.example:2379", "etcd.example:2379", "etcd.example",
		"etcd-user:s3cr%40t", "etcd-user", "s3cr@t", "s3cr%40t",
		"unix:///run/etcd.sock", "/run/etcd.sock",
		"unix://rel.sock:0", "rel.sock:0",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("EndpointSecrets lacks %q: %q", want, got)
		}
	}
	if slices.Contains(got, "") {
		t.Errorf("EndpointSecrets holds an empty string: %q", got)
	}
}

// dialing is a Source that dials each endpoint for real and fails with
// what the dial says, each error quoting its endpoint as weftctl's do:
// a TCP port with nothing listening (inside a test namespace, dialled from
// there) and a unix socket path that does not exist.
type dialing struct {
	ns        *namespace.NS
	endpoints string
	raw       chan string // each error before redaction
}

func (d dialing) fail(ctx context.Context) error {
	var errs []error
	for _, ep := range strings.Split(d.endpoints, ",") {
		var err error
		if path, ok := strings.CutPrefix(ep, "unix://"); ok {
			var c net.Conn
			if c, err = (&net.Dialer{}).DialContext(ctx, "unix", path); err == nil {
				c.Close()
			}
		} else {
			host := ep[strings.LastIndex(ep, "@")+1:]
			host = strings.TrimPrefix(host, "http://")
			var c net.Conn
			if c, err = d.ns.DialContext(ctx, "tcp", host); err == nil {
				c.Close()
			}
		}
		if err == nil {
			return fmt.Errorf("%s answered: the test needs an endpoint with nothing there", ep)
		}
		errs = append(errs, fmt.Errorf("etcd %s: %w", ep, err))
	}
	err := errors.Join(errs...)
	select {
	case d.raw <- err.Error():
	default:
	}
	return err
}

func (d dialing) Snapshot(ctx context.Context) (*Snapshot, error) { return nil, d.fail(ctx) }

func (d dialing) Path(ctx context.Context, _, _ netip.Addr) (*PathView, error) {
	return nil, d.fail(ctx)
}

// TestEndpointsRedacted: with two endpoints, real dial errors that quote
// each endpoint and its dial address reach the page without any part of
// either: the URL, host:port, host, socket path, user or password.
func TestEndpointsRedacted(t *testing.T) {
	ns := nettest.NewNS(t, "webdial") // only lo: nothing listens on its 127.0.0.1:2379
	sock := filepath.Join(t.TempDir(), "absent-etcd.sock")
	endpoints := "http://etcd-user:s3cr3t@127.0.0.1:2379,unix://" + sock
	src := dialing{ns: ns, endpoints: endpoints, raw: make(chan string, 1)}
	s := &Server{Source: src, Interval: 50 * time.Millisecond, Redact: EndpointSecrets(endpoints)}
	ts := serveWith(t, s)
	raw := <-src.raw
	forbidden := []string{"http://etcd-user:s3cr3t@127.0.0.1:2379", "unix://" + sock, "127.0.0.1:2379", "127.0.0.1", sock, "etcd-user", "s3cr3t"}
	for _, want := range []string{"127.0.0.1:2379", sock, "connection refused", "no such file"} {
		if !strings.Contains(raw, want) {
			t.Fatalf("the dial errors do not quote %q (the test checks nothing):\n%s", want, raw)
		}
	}
	for _, r := range []string{"/api/snapshot", "/api/events", "/api/path?src=10.244.1.2&dst=10.244.2.2"} {
		_, body := get(t, ts, r)
		if !strings.Contains(body, "[redacted]") || !strings.Contains(body, "connection refused") {
			t.Errorf("%s: the dial error did not reach the page, redacted:\n%s", r, body)
		}
		for _, f := range forbidden {
			if strings.Contains(body, f) {
				t.Errorf("%s: response holds %q:\n%s", r, f, body)
			}
		}
	}
}

// TestScrubLongestFirst: an endpoint is hidden whole even when one of its
// parts comes first in Redact.
func TestScrubLongestFirst(t *testing.T) {
	s := &Server{Redact: []string{"etcd.example", "etcd.example:2379"}}
	if got := s.scrub("dial tcp etcd.example:2379: i/o timeout"); got != "dial tcp [redacted]: i/o timeout" {
		t.Errorf("scrub: %q", got)
	}
}
