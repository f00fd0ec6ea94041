package etcd

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestUnreachableNamesEndpoints checks that the error a daemon logs while
// etcd does not answer names the endpoints it tried.
func TestUnreachableNamesEndpoints(t *testing.T) {
	c, err := NewClient(ClientConfig{Endpoints: []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}, DialTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := New(c, Options{RequestTimeout: 300 * time.Millisecond}, nil)
	_, err = r.Config(context.Background())
	if err == nil || !strings.Contains(err.Error(), "etcd http://127.0.0.1:1,http://127.0.0.1:2") {
		t.Fatalf("err = %v, want it to name both endpoints", err)
	}
}
