package kube

import (
	"log/slog"

	"k8s.io/klog/v2"
)

// LogClientGo sends what client-go logs through klog (a failed watch, an
// error handled in the background, the API server's warnings) to log,
// tagged component=client-go, instead of klog's own lines on stderr: its
// errors come out as slog errors, its informational lines at slog's info
// level, and its verbose ones (klog -v, which nobody sets here) not at all.
// klog is global, so only a main calls this, once, before any client.
func LogClientGo(log *slog.Logger) {
	klog.SetSlogLogger(log.With("component", "client-go"))
}
