package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/weft-net/weft/subnet/kube"
)

func TestKubeLeases(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "net-conf.json")
	if err := os.WriteFile(conf, []byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	p := kube.DefaultAnnotationPrefix + "/"
	node := func(name, cidr string, ann map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}, Spec: corev1.NodeSpec{PodCIDR: cidr}}
	}
	c := fake.NewClientset(
		node("a", "10.244.1.0/24", map[string]string{p + "kube-subnet-manager": "true", p + "backend-type": "vxlan",
			p + "public-ip": "192.168.77.1", p + "backend-data": `{"VNI":1,"VtepMAC":"02:00:00:00:00:01"}`}),
		node("b", "10.244.2.0/24", map[string]string{p + "kube-subnet-manager": "true", p + "backend-type": "vxlan",
			p + "public-ip": "192.168.77.2", p + "backend-data": `{"VNI":1,"VtepMAC":"02:00:00:00:00:02"}`}),
		node("not-managed", "10.244.3.0/24", nil),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ls, cfg, err := kubeLeases(ctx, fakeNodes{c.CoreV1().Nodes()}, kube.Options{NodeName: "weftctl", ConfigFile: conf}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Network.String() != "10.244.0.0/16" {
		t.Errorf("config network %s", cfg.Network)
	}
	if len(ls) != 2 {
		t.Fatalf("%d leases, want the 2 managed nodes: %+v", len(ls), ls)
	}
	tests := []struct{ subnet, ip, mac string }{
		{"10.244.1.0/24", "192.168.77.1", "02:00:00:00:00:01"},
		{"10.244.2.0/24", "192.168.77.2", "02:00:00:00:00:02"},
	}
	for i, tt := range tests {
		l := ls[i]
		if l.Subnet.String() != tt.subnet || l.Attrs.PublicIP.String() != tt.ip || l.Attrs.BackendData == nil || l.Attrs.BackendData.VtepMAC.String() != tt.mac {
			t.Errorf("lease %d = %s %s %+v, want %v", i, l.Subnet, l.Attrs.PublicIP, l.Attrs.BackendData, tt)
		}
	}
}

// fakeNodes is the fake clientset's Node client, saying, as the fake
// clientset itself does, that its watch cannot stream the initial list.
type fakeNodes struct{ kube.Nodes }

func (fakeNodes) IsWatchListSemanticsUnSupported() bool { return true }

// TestSecretsSplitEndpoints: each of several endpoints is hidden with its
// host:port, host, socket path and user information, as errors quote them.
func TestSecretsSplitEndpoints(t *testing.T) {
	var s store
	s.etcd.Endpoints = "https://etcd-user:s3cr3t@10.0.0.5:2379,unix:///run/weft/etcd.sock"
	got := s.secrets()
	for _, want := range []string{"https://etcd-user:s3cr3t@10.0.0.5:2379", "10.0.0.5:2379", "10.0.0.5", "etcd-user", "s3cr3t",
		"unix:///run/weft/etcd.sock", "/run/weft/etcd.sock"} {
		if !slices.Contains(got, want) {
			t.Errorf("secrets lack %q: %q", want, got)
		}
	}
}
