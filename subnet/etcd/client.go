package etcd

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// DefaultDialTimeout bounds the client's first contact with etcd.
const DefaultDialTimeout = 5 * time.Second

// How the client notices a dead connection and how soon it dials again.
// keepAliveTime stays above etcd's minimum (--grpc-keepalive-min-time, 5 s
// by default), below which etcd closes the connection of a client that
// pings too often.
const (
	keepAliveTime     = 10 * time.Second // ping etcd after this long without a frame from it
	keepAliveTimeout  = 10 * time.Second // and give the connection up if the ping has no answer by then
	reconnectMaxDelay = 2 * time.Second  // at most this long (±20 %) between two dials of an unreachable etcd
)

// ClientConfig says how to reach etcd.
type ClientConfig struct {
	// Endpoints are etcd client URLs: http://host:port, https://host:port,
	// unix:///path or unixs:///path (TLS over a unix socket).
	Endpoints []string
	// CAFile verifies the server; CertFile and KeyFile are the client
	// certificate. Any of them turns TLS on, and then every endpoint must be
	// https:// or unix(s)://. An https:// endpoint without CAFile is verified
	// against the system roots.
	CAFile, CertFile, KeyFile string
	// Username and Password enable etcd authentication.
	Username, Password string
	// DialTimeout defaults to DefaultDialTimeout.
	DialTimeout time.Duration
}

// NewClient validates cfg and returns an etcd client. It does not wait for a
// connection: the first request does. Every inconsistent setting is an
// error naming what is wrong; TLS is never silently dropped.
func NewClient(cfg ClientConfig) (*clientv3.Client, error) {
	endpoints, useTLS, err := checkEndpoints(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	if cfg.Password != "" && cfg.Username == "" {
		return nil, errors.New("etcd client: a password is set but no user name")
	}
	if cfg.DialTimeout < 0 {
		return nil, fmt.Errorf("etcd client: dial timeout %s: must not be negative", cfg.DialTimeout)
	}
	cc := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: cfg.DialTimeout,
		Username:    cfg.Username,
		Password:    cfg.Password,
		Logger:      zap.NewNop(),
		// A connection that stops answering (etcd's host gone, a firewall
		// dropping packets) is given up after keepAliveTime+keepAliveTimeout
		// and dialled again. Without it a watch waits silently for TCP's
		// retransmissions, which back off to minutes, so a node cut off
		// for a few minutes learned nothing and renewed nothing for minutes
		// more after the cut (bench/faults: node cut off from etcd).
		DialKeepAliveTime:    keepAliveTime,
		DialKeepAliveTimeout: keepAliveTimeout,
		// Reconnect at most reconnectMaxDelay apart: gRPC's default backoff
		// grows to 2 minutes, so after a long etcd outage a node would keep
		// failing long after etcd is back (bench/faults: etcd outage).
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: time.Second, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnectMaxDelay},
			MinConnectTimeout: 5 * time.Second,
		})},
	}
	if cc.DialTimeout == 0 {
		cc.DialTimeout = DefaultDialTimeout
	}
	if useTLS {
		if cc.TLS, err = tlsConfig(cfg); err != nil {
			return nil, fmt.Errorf("etcd client: %w", err)
		}
	}
	c, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return c, nil
}

// checkEndpoints validates the endpoints against the TLS settings and says
// whether the client needs a TLS config.
func checkEndpoints(cfg ClientConfig) ([]string, bool, error) {
	files := cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != ""
	if len(cfg.Endpoints) == 0 {
		return nil, false, errors.New("no endpoints: give at least one http://, https:// or unix:// URL")
	}
	var out []string
	var plain, secure string // one example of each kind, for errors
	for _, ep := range cfg.Endpoints {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			return nil, false, fmt.Errorf("endpoints %q: an endpoint is empty", strings.Join(cfg.Endpoints, ","))
		}
		if !strings.Contains(ep, "://") {
			return nil, false, fmt.Errorf("endpoint %q: no scheme: write http://%s, https://%s or unix:///path", ep, ep, ep)
		}
		u, err := url.Parse(ep)
		if err != nil {
			return nil, false, fmt.Errorf("endpoint %q: %w", ep, err)
		}
		switch u.Scheme {
		case "http":
			plain = ep
		case "https", "unixs":
			secure = ep
		case "unix":
		default:
			return nil, false, fmt.Errorf("endpoint %q: scheme %q not supported: use http, https, unix or unixs", ep, u.Scheme)
		}
		if (u.Scheme == "http" || u.Scheme == "https") && u.Host == "" {
			return nil, false, fmt.Errorf("endpoint %q: no host", ep)
		}
		if (u.Scheme == "unix" || u.Scheme == "unixs") && u.Host == "" && u.Path == "" && u.Opaque == "" {
			return nil, false, fmt.Errorf("endpoint %q: no socket path", ep)
		}
		out = append(out, ep)
	}
	switch {
	case plain != "" && secure != "":
		return nil, false, fmt.Errorf("endpoints mix plain %q and TLS %q: use one kind", plain, secure)
	case plain != "" && files:
		return nil, false, fmt.Errorf("endpoint %q is plain http but TLS files are given: use https://", plain)
	}
	return out, files || secure != "", nil
}

// tlsConfig builds the client TLS config from the files.
func tlsConfig(cfg ClientConfig) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	switch {
	case cfg.CertFile != "" && cfg.KeyFile == "":
		return nil, fmt.Errorf("certificate file %s given without a key file", cfg.CertFile)
	case cfg.KeyFile != "" && cfg.CertFile == "":
		return nil, fmt.Errorf("key file %s given without a certificate file", cfg.KeyFile)
	case cfg.CertFile != "":
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate %s, key %s: %w", cfg.CertFile, cfg.KeyFile, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: no PEM certificate in it", cfg.CAFile)
		}
		tc.RootCAs = pool
	}
	return tc, nil
}
