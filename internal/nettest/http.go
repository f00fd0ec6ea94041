package nettest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// DialContext dials from inside the namespace: the socket is created on a
// thread switched into it, and keeps the namespace afterwards.
func (n *NS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen opens a listener inside the namespace.
func (n *NS) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// HTTPGet fetches url from inside the namespace and returns the status
// code and body.
func (n *NS) HTTPGet(url string) (int, string, error) {
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{DialContext: n.DialContext, DisableKeepAlives: true},
	}
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", fmt.Errorf("get %s in %s: %w", url, n.Name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
