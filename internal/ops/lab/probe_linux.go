package lab

import (
	"context"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/weft-net/weft/internal/namespace"
)

// HTTPClient returns a client whose connections are opened inside n, so
// that 127.0.0.1 means n's own loopback (each weftd serves /readyz there).
func HTTPClient(n *namespace.NS) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := n.Do(func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	return &http.Client{
		Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true},
		Timeout:   3 * time.Second,
	}
}

// Get fetches url inside n and returns the status code and body.
func Get(ctx context.Context, n *namespace.NS, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := HTTPClient(n).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}
