package kube

import (
	"context"
	"log/slog"

	"k8s.io/klog/v2"
)

// LogClientGo sends what client-go logs through klog (a failed watch, an
// error handled in the background, the API server's warnings) to log,
// tagged component=client-go, instead of klog's own lines on stderr: its
// errors come out as slog errors and its informational lines at slog's info
// level. Its verbose lines (klog's V(1) and up: feature gates, reflector
// starts, request traces) are dropped whatever log's level, as klog drops
// them by default. klog is global, so only a main calls this, once, before
// any client.
func LogClientGo(log *slog.Logger) {
	klog.SetSlogLogger(slog.New(infoAndUp{log.With("component", "client-go").Handler()}))
}

// infoAndUp passes on records at slog.LevelInfo and above.
type infoAndUp struct{ slog.Handler }

func (h infoAndUp) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelInfo && h.Handler.Enabled(ctx, l)
}

func (h infoAndUp) WithAttrs(as []slog.Attr) slog.Handler { return infoAndUp{h.Handler.WithAttrs(as)} }
func (h infoAndUp) WithGroup(name string) slog.Handler    { return infoAndUp{h.Handler.WithGroup(name)} }
