// Package etcdlocal runs an embedded etcd server for tests, benchmarks and
// the lab. It serves clients on a unix socket, which processes in any network
// namespace reach through the file system, so no test traffic needs a route;
// optionally also on loopback TCP.
package etcdlocal

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is a running embedded etcd member.
type Server struct {
	etcd *embed.Etcd
	// Endpoint is the client URL to hand to clientv3 and weftd
	// ("unix:///…/etcd.sock").
	Endpoint string
	Dir      string
}

// Start starts a single-member etcd with its data and socket under dir.
func Start(dir string) (*Server, error) {
	cfg := embed.NewConfig()
	cfg.Name = "weft"
	cfg.Dir = filepath.Join(dir, "data")
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.LogLevel = "error"
	sock := filepath.Join(dir, "etcd.sock")
	os.Remove(sock)
	cu := url.URL{Scheme: "unix", Path: sock}
	pu, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls = []url.URL{cu}
	cfg.AdvertiseClientUrls = []url.URL{cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("start etcd: not ready after 30s")
	}
	return &Server{etcd: e, Endpoint: "unix://" + sock, Dir: dir}, nil
}

// Close stops the server.
func (s *Server) Close() { s.etcd.Close() }
