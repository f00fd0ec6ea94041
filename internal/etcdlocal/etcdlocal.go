// Package etcdlocal runs embedded etcd servers for tests, benchmarks and the
// lab: a single member serving clients on a unix socket (processes in any
// network namespace reach it through the file system, so no test traffic
// needs a route), a single member serving TLS on loopback, a cluster of
// members on loopback that can be stopped and restarted one by one, and a
// proxy that can cut a client off from a server.
package etcdlocal

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// readyTimeout bounds how long a start waits for etcd to serve.
var readyTimeout = 30 * time.Second // a variable for a test

// Server is a running embedded etcd member.
type Server struct {
	etcd *embed.Etcd
	// Endpoint is the client URL to hand to clientv3 and weftd
	// ("unix:///…/etcd.sock", or "https://127.0.0.1:port" for StartTLS).
	Endpoint string
	Dir      string

	closeOnce sync.Once
}

// Start starts a single-member etcd with its data and socket under dir.
func Start(dir string) (*Server, error) {
	sock := filepath.Join(dir, "etcd.sock")
	os.Remove(sock)
	cfg := baseConfig("weft", dir)
	cu := url.URL{Scheme: "unix", Path: sock}
	cfg.ListenClientUrls = []url.URL{cu}
	cfg.AdvertiseClientUrls = []url.URL{cu}
	e, err := startSingle(cfg)
	if err != nil {
		return nil, err
	}
	return &Server{etcd: e, Endpoint: "unix://" + sock, Dir: dir}, nil
}

// TLSFiles are PEM files for a TLS server.
type TLSFiles struct {
	CertFile, KeyFile string // the server's certificate and key
	// ClientCAFile, when set, makes the server require client certificates
	// signed by it.
	ClientCAFile string
}

// StartTLS starts a single-member etcd that serves clients over TLS on
// 127.0.0.1 (an https:// endpoint on a free port).
func StartTLS(dir string, files TLSFiles) (*Server, error) {
	if files.CertFile == "" || files.KeyFile == "" {
		return nil, errors.New("start etcd with TLS: CertFile and KeyFile are required")
	}
	cfg := baseConfig("weft", dir)
	cu := url.URL{Scheme: "https", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls = []url.URL{cu}
	cfg.AdvertiseClientUrls = []url.URL{cu}
	cfg.ClientTLSInfo = transport.TLSInfo{
		CertFile:       files.CertFile,
		KeyFile:        files.KeyFile,
		TrustedCAFile:  files.ClientCAFile,
		ClientCertAuth: files.ClientCAFile != "",
	}
	e, err := startSingle(cfg)
	if err != nil {
		return nil, err
	}
	return &Server{etcd: e, Endpoint: "https://" + e.Clients[0].Addr().String(), Dir: dir}, nil
}

// baseConfig is a quiet member config with its data under dir and a
// loopback peer URL on a port the kernel picks (fine for one member).
func baseConfig(name, dir string) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = filepath.Join(dir, "data")
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.LogLevel = "error"
	cfg.BcryptCost = 4 // the minimum: tests that enable auth stay fast
	pu := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenPeerUrls = []url.URL{pu}
	cfg.AdvertisePeerUrls = []url.URL{pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	return cfg
}

func startSingle(cfg *embed.Config) (*embed.Etcd, error) {
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	if err := waitReady(e); err != nil {
		abandon(e)
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	return e, nil
}

func waitReady(e *embed.Etcd) error {
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return err
	case <-time.After(readyTimeout):
		return fmt.Errorf("not ready after %s", readyTimeout)
	}
}

// abandon stops a server that never became ready. Its Close would wait for
// client servers that start only once it is ready, forever (a test's
// cleanup then hung until go test's timeout): raft is stopped at once and
// the rest closes in the background, without anyone waiting for it.
func abandon(e *embed.Etcd) {
	e.Server.HardStop()
	go e.Close()
}

// Close stops the server; closing again does nothing.
func (s *Server) Close() { s.closeOnce.Do(s.etcd.Close) }

// freePorts returns n different TCP ports on 127.0.0.1 that were free a
// moment ago. Each listener stays open until all are found: closed at once,
// the kernel may hand the same port out again (two members of a cluster
// then got one peer port).
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
