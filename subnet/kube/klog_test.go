package kube

import (
	"bytes"
	"context"
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
	var warn, debug bytes.Buffer
	LogClientGo(slog.New(slog.NewTextHandler(&warn, &slog.HandlerOptions{Level: slog.LevelWarn})))
	klog.ErrorS(errors.New("connection refused"), "Failed to watch", "reflector", "nodes")
	klog.Error("unhandled error")
	klog.Info("a line for info")
	klog.V(4).Info("a verbose line")
	// At debug level: info passes, verbose lines (also through the
	// contextual logger client-go's informers use) do not.
	LogClientGo(slog.New(slog.NewTextHandler(&debug, &slog.HandlerOptions{Level: slog.LevelDebug})))
	klog.Info("a line for info")
	klog.V(1).Info("a verbose line")
	klog.FromContext(context.Background()).V(3).Info("a verbose contextual line")
	klog.Background().Info("a contextual line for info")
	klog.Flush()
	os.Stderr = stderr
	w.Close()
	leaked, _ := io.ReadAll(r)
	klog.ClearLogger()
	if len(leaked) != 0 {
		t.Errorf("klog wrote to stderr: %q", leaked)
	}
	out := warn.String()
	for _, want := range []string{`level=ERROR msg="Failed to watch" component=client-go err="connection refused" reflector=nodes`, `level=ERROR msg="unhandled error" component=client-go`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "a line for info") || strings.Contains(out, "verbose") {
		t.Errorf("info or verbose lines above the logger's level:\n%s", out)
	}
	out = debug.String()
	if !strings.Contains(out, `level=INFO msg="a line for info" component=client-go`) || !strings.Contains(out, `msg="a contextual line for info"`) || strings.Contains(out, "verbose") {
		t.Errorf("at debug level, want the info lines and no verbose one:\n%s", out)
	}
}
