package kubeprobe

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/weft-net/weft/internal/ops/connectivity"
)

// ProbeConfig is what one probe pod knows about itself.
type ProbeConfig struct {
	Pod, Node string // its pod's name (in the client's namespace) and node
	Port      int    // the TCP echo port, the same in every probe
	Host      bool   // on the node's network: listen on the VTEP address
	Options   connectivity.Options
	Log       *slog.Logger
}

// Probe is the program of a probe pod: it answers TCP exchanges on Port
// (the kernel answers the echo requests), waits for the targets annotation
// on its own pod, measures every other target from this pod's network
// namespace, publishes its row on its own pod, and serves until ctx ends
// (the pod is deleted).
func Probe(ctx context.Context, c *Client, pc ProbeConfig) error {
	listen := netip.IPv4Unspecified()
	if pc.Host {
		vtep, err := VTEPAddr()
		if err != nil {
			pc.Log.Warn("no node-to-node probe on this node", "err", err)
			if err := announce(ctx, c, pc, "none: "+err.Error()); err != nil {
				return err
			}
			<-ctx.Done()
			return nil
		}
		listen = vtep
	}
	srv, err := connectivity.ListenTCP(nil, netip.AddrPortFrom(listen, uint16(pc.Port)))
	if err != nil {
		return err
	}
	defer srv.Close()
	if pc.Host {
		if err := announce(ctx, c, pc, listen.String()); err != nil {
			return err
		}
	}
	pc.Log.Info("probe serving", "pod", pc.Pod, "node", pc.Node, "addr", srv.Addr())
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
	if err := publish(ctx, c, pc, AnnotationResult, string(b)); err != nil {
		return nil // deleted meanwhile
	}
	pc.Log.Info("result published", "pairs", len(pairs))
	<-ctx.Done()
	return nil
}

// announce says where a host probe listens (or why it does not).
func announce(ctx context.Context, c *Client, pc ProbeConfig, v string) error {
	return publish(ctx, c, pc, AnnotationEndpoint, v)
}

// publish sets an annotation on the probe's own pod, retrying until it
// works or ctx ends.
func publish(ctx context.Context, c *Client, pc ProbeConfig, key, value string) error {
	for {
		err := c.Annotate(ctx, pc.Pod, key, value)
		if err == nil {
			return nil
		}
		pc.Log.Warn("annotate this probe's pod", "key", key, "err", err)
		if err := sleep(ctx, poll); err != nil {
			return err
		}
	}
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
