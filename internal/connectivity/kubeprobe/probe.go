package kubeprobe

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/weft-net/weft/internal/connectivity"
)

// ProbeConfig is what one probe pod knows about itself.
type ProbeConfig struct {
	Pod, Node string // its pod's name (in the client's namespace) and node
	Port      int    // the TCP echo port, the same in every probe
	Options   connectivity.Options
	Log       *slog.Logger
}

// Probe is the program of a probe pod: it answers TCP exchanges on Port
// (the kernel answers the echo requests), waits for the targets annotation
// on its own pod, measures every other target from this pod's network
// namespace, publishes its row on its own pod, and serves until ctx ends
// (the pod is deleted).
func Probe(ctx context.Context, c *Client, pc ProbeConfig) error {
	srv, err := connectivity.ListenTCP(nil, netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(pc.Port)))
	if err != nil {
		return err
	}
	defer srv.Close()
	pc.Log.Info("probe serving", "pod", pc.Pod, "node", pc.Node, "port", pc.Port)
	targets, err := awaitTargets(ctx, c, pc)
	if ctx.Err() != nil {
		return nil // deleted before the run began measuring
	}
	if err != nil {
		return err
	}
	var eps []connectivity.Endpoint
	for _, t := range targets {
		a, err := netip.ParseAddr(t.IP)
		if err != nil {
			pc.Log.Warn("skipping a target", "node", t.Node, "ip", t.IP, "err", err)
			continue
		}
		eps = append(eps, connectivity.Endpoint{Name: t.Node, Addr: a, TCPPort: uint16(pc.Port)})
	}
	pairs := connectivity.MeasureFrom(ctx, connectivity.Endpoint{Name: pc.Node}, eps, pc.Options)
	b, err := json.Marshal(connectivity.Row{Node: pc.Node, Pods: connectivity.ToJSON(pairs)})
	if err != nil {
		return err
	}
	for {
		err := c.Annotate(ctx, pc.Pod, AnnotationResult, string(b))
		if err == nil {
			break
		}
		pc.Log.Warn("publish the result", "err", err)
		if sleep(ctx, poll) != nil {
			return nil
		}
	}
	pc.Log.Info("result published", "pairs", len(pairs))
	<-ctx.Done()
	return nil
}

// awaitTargets reads its own pod until the targets annotation is there.
func awaitTargets(ctx context.Context, c *Client, pc ProbeConfig) ([]Target, error) {
	for {
		p, err := c.GetPod(ctx, pc.Pod)
		switch {
		case err != nil:
			pc.Log.Warn("read this probe's pod", "err", err)
		case p.Annotations[AnnotationTargets] != "":
			var ts []Target
			if err := json.Unmarshal([]byte(p.Annotations[AnnotationTargets]), &ts); err != nil {
				return nil, fmt.Errorf("annotation %s: %w", AnnotationTargets, err)
			}
			return ts, nil
		}
		if err := sleep(ctx, poll); err != nil {
			return nil, err
		}
	}
}
