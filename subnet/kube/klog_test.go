package kube

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// TestLogClientGo checks that klog's lines reach the slog logger, at the
// matching level, and nothing reaches stderr.
func TestLogClientGo(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	var buf bytes.Buffer
	LogClientGo(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	klog.ErrorS(errors.New("connection refused"), "Failed to watch", "reflector", "nodes")
	klog.Error("unhandled error")
	klog.Info("a line for info")
	klog.V(4).Info("a verbose line")
	klog.Flush()
	os.Stderr = stderr
	w.Close()
	leaked, _ := io.ReadAll(r)
	klog.ClearLogger()
	if len(leaked) != 0 {
		t.Errorf("klog wrote to stderr: %q", leaked)
	}
	out := buf.String()
	for _, want := range []string{`level=ERROR msg="Failed to watch" component=client-go err="connection refused" reflector=nodes`, `level=ERROR msg="unhandled error" component=client-go`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "a line for info") || strings.Contains(out, "verbose") {
		t.Errorf("info or verbose lines above the logger's level:\n%s", out)
	}
}
