package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-net/weft/subnet"
)

// storedIPs is a registry that stores the node's public IPs (as the
// Kubernetes registry does in the node-public-ip annotations).
// Its first fails calls fail (the Node does not exist yet).
type storedIPs struct {
	fakeRegistry
	v4, v6 netip.Addr
	fails  int
}

func (s *storedIPs) NodePublicIPs(context.Context) (netip.Addr, netip.Addr, error) {
	if s.fails != 0 {
		s.fails--
		return netip.Addr{}, netip.Addr{}, errors.New("no such node")
	}
	return s.v4, s.v6, nil
}

// TestPublicIPs: the addresses that choose the underlay are the flags',
// and the registry's stored ones (node-public-ip) win over them, per
// family, as they do for flanneld.
func TestPublicIPs(t *testing.T) {
	a := netip.MustParseAddr
	tests := []struct {
		name    string
		args    []string
		reg     *storedIPs // nil: a registry that stores none (etcd)
		want4   netip.Addr
		want6   netip.Addr
		wantErr bool
	}{
		{"none", nil, nil, netip.Addr{}, netip.Addr{}, false},
		{"flags", []string{"--public-ip", "10.77.0.1", "--public-ipv6", "fd77::1"}, nil, a("10.77.0.1"), a("fd77::1"), false},
		{"annotation wins", []string{"--public-ip", "10.77.0.1", "--public-ipv6", "fd77::1"},
			&storedIPs{v4: a("10.88.0.1")}, a("10.88.0.1"), a("fd77::1"), false},
		{"annotation alone", nil, &storedIPs{v4: a("10.88.0.1"), v6: a("fd88::1")}, a("10.88.0.1"), a("fd88::1"), false},
		{"bad flag", []string{"--public-ip", "fd77::1"}, nil, netip.Addr{}, netip.Addr{}, true},
		{"registry error, retried", nil, &storedIPs{v4: a("10.88.0.1"), fails: 2}, a("10.88.0.1"), netip.Addr{}, false},
		{"registry error until ctx ends", nil, &storedIPs{fails: -1}, netip.Addr{}, netip.Addr{}, true},
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseFlags("weftd", tt.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var reg subnet.Registry = &fakeRegistry{}
			if tt.reg != nil {
				reg = tt.reg
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			v4, v6, err := publicIPs(ctx, c, reg, log)
			if (err != nil) != tt.wantErr {
				t.Fatalf("publicIPs: %v, want error %v", err, tt.wantErr)
			}
			if !tt.wantErr && (v4 != tt.want4 || v6 != tt.want6) {
				t.Fatalf("publicIPs = %s %s, want %s %s", v4, v6, tt.want4, tt.want6)
			}
		})
	}
}
