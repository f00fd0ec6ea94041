package kubeprobe

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/weft-net/weft/internal/connectivity"
)

// poll is how often a run (and a probe) reads the API while it waits.
const poll = 500 * time.Millisecond

// Options of a run.
type Options struct {
	Spec Spec
	// Wait bounds each stage: the probes getting ready, their results
	// (beyond the time the measurements themselves take), the deletion.
	Wait    time.Duration
	Timeout time.Duration // Spec.Timeout as a duration
	Log     *slog.Logger  // progress at info, trouble at warn
}

// Result is a run's outcome: the pairs the probes measured, and the
// nodes whose probe did not take part.
type Result struct {
	DaemonSet string
	Matrix    *connectivity.Matrix
	Missing   []string // one line per probe that was not ready or sent no result
}

// Failures counts the failed pairs and the missing probes.
func (r *Result) Failures() int { return r.Matrix.Failures() + len(r.Missing) }

// Render prints the matrix and the missing probes.
func (r *Result) Render(w io.Writer) error {
	if err := r.Matrix.Render(w); err != nil {
		return err
	}
	for _, m := range r.Missing {
		if _, err := fmt.Fprintf(w, "✗ %s\n", m); err != nil {
			return err
		}
	}
	if len(r.Missing) > 0 {
		_, err := fmt.Fprintf(w, "%d probe(s) did not take part: their nodes are not in the matrix\n", len(r.Missing))
		return err
	}
	return nil
}

// Run creates the probe DaemonSet, waits for its pods, has them measure
// each other, collects their rows and deletes the DaemonSet (also when ctx
// is cancelled), waiting until its pods are gone.
func Run(ctx context.Context, c *Client, o Options) (res *Result, err error) {
	warnLeftovers(ctx, c, o.Log)
	ds, err := c.CreateDaemonSet(ctx, o.Spec.DaemonSet())
	if err != nil {
		return nil, fmt.Errorf("create the probe DaemonSet in namespace %s: %w (kube-manifests/weft-connectivity.yml creates the namespace, the probes' ServiceAccount and the Role weftctl needs)", c.Namespace, err)
	}
	o.Log.Info("created the probe DaemonSet", "namespace", c.Namespace, "name", ds.Name)
	defer func() {
		// A DaemonSet left behind is reported, not failed on: the
		// measurements stand, and a node that is down keeps its pod
		// terminating until it returns.
		if derr := deleteAndWait(context.WithoutCancel(ctx), c, ds.Name, o); derr != nil {
			o.Log.Warn("cleanup", "err", derr)
		}
	}()
	res = &Result{DaemonSet: ds.Name, Matrix: &connectivity.Matrix{Title: fmt.Sprintf("Pod to pod (probe DaemonSet %s/%s, a pod per node):", c.Namespace, ds.Name)}}
	selector := LabelRun + "=" + o.Spec.Run
	ready, notReady, err := waitReady(ctx, c, ds.Name, selector, o)
	if err != nil {
		return nil, err
	}
	res.Missing = notReady
	targets := make([]Target, 0, len(ready))
	for _, p := range ready {
		targets = append(targets, Target{Node: p.Spec.NodeName, IP: p.Status.PodIP})
	}
	b, _ := json.Marshal(targets)
	for _, p := range ready {
		if err := c.Annotate(ctx, p.Name, AnnotationTargets, string(b)); err != nil {
			return nil, fmt.Errorf("hand the targets to probe %s: %w", p.Name, err)
		}
	}
	o.Log.Info("probes measuring", "ready", len(ready), "notReady", len(notReady))
	// Each probe measures the others in turn: count echo requests and one
	// TCP exchange per peer, each up to Timeout.
	measuring := time.Duration(len(ready)) * time.Duration(o.Spec.Count+1) * o.Timeout
	rows, missing, err := collect(ctx, c, ready, selector, o.Wait+measuring)
	if err != nil {
		return nil, err
	}
	res.Missing = append(res.Missing, missing...)
	for _, r := range rows {
		res.Matrix.Pairs = append(res.Matrix.Pairs, connectivity.FromJSON(r.Pods)...)
	}
	return res, nil
}

// warnLeftovers names the probe DaemonSets of other runs: one still
// running (whose probes load the nodes too), or one a killed weftctl left.
func warnLeftovers(ctx context.Context, c *Client, log *slog.Logger) {
	l, err := c.ListDaemonSets(ctx, LabelName+"="+NameProbe)
	if err != nil {
		log.Warn("list the probe DaemonSets of other runs", "err", err)
		return
	}
	for _, ds := range l.Items {
		log.Warn("another run's probe DaemonSet: still running, or left by a killed weftctl (delete it with kubectl -n "+c.Namespace+" delete daemonset "+ds.Name+")",
			"name", ds.Name, "created", ds.CreationTimestamp.UTC().Format(time.RFC3339))
	}
}

// waitReady waits until every pod the DaemonSet wants is ready with an IP,
// or until o.Wait passes; it returns the ready pods (ordered by node) and a
// line for each that is not.
func waitReady(ctx context.Context, c *Client, name, selector string, o Options) ([]corev1.Pod, []string, error) {
	deadline := time.Now().Add(o.Wait)
	for {
		ds, err := c.GetDaemonSet(ctx, name)
		if err != nil {
			return nil, nil, fmt.Errorf("read the probe DaemonSet: %w", err)
		}
		pods, err := c.ListPods(ctx, selector)
		if err != nil {
			return nil, nil, fmt.Errorf("list the probe pods: %w", err)
		}
		ready, notReady := splitReady(pods.Items)
		want := int(ds.Status.DesiredNumberScheduled)
		settled := ds.Status.ObservedGeneration >= ds.Generation && want > 0
		if settled && len(ready) >= want {
			return ready, nil, nil
		}
		if time.Now().After(deadline) {
			if len(ready)+len(notReady) < want {
				notReady = append(notReady, fmt.Sprintf("the DaemonSet wants %d pods, %d exist (see its events)", want, len(ready)+len(notReady)))
			}
			if len(ready) == 0 {
				return nil, nil, fmt.Errorf("no probe pod ready within --wait %s (the DaemonSet wants %d): %v", o.Wait, want, notReady)
			}
			return ready, notReady, nil
		}
		if err := sleep(ctx, poll); err != nil {
			return nil, nil, err
		}
	}
}

// splitReady sorts the live pods into ready (with an IP) and not.
func splitReady(pods []corev1.Pod) (ready []corev1.Pod, notReady []string) {
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		if isReady(p) && p.Status.PodIP != "" && p.Spec.NodeName != "" {
			ready = append(ready, p)
			continue
		}
		node := p.Spec.NodeName
		if node == "" {
			node = "(not scheduled)"
		}
		why := string(p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Waiting != nil {
				why += ": " + cs.State.Waiting.Reason + " " + cs.State.Waiting.Message
			}
		}
		notReady = append(notReady, fmt.Sprintf("node %s: probe pod %s not ready (%s)", node, p.Name, why))
	}
	sort.Slice(ready, func(i, j int) bool { return ready[i].Spec.NodeName < ready[j].Spec.NodeName })
	sort.Strings(notReady)
	return ready, notReady
}

func isReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// collect waits for the result annotation of every pod in ready, up to
// wait; it returns the rows and a line for each probe without one.
func collect(ctx context.Context, c *Client, ready []corev1.Pod, selector string, wait time.Duration) ([]connectivity.Row, []string, error) {
	deadline := time.Now().Add(wait)
	for {
		pods, err := c.ListPods(ctx, selector)
		if err != nil {
			return nil, nil, fmt.Errorf("list the probe pods: %w", err)
		}
		byName := map[string]corev1.Pod{}
		for _, p := range pods.Items {
			byName[p.Name] = p
		}
		var rows []connectivity.Row
		var missing []string
		for _, p := range ready {
			var row connectivity.Row
			v, ok := byName[p.Name].Annotations[AnnotationResult]
			if !ok || json.Unmarshal([]byte(v), &row) != nil {
				missing = append(missing, fmt.Sprintf("node %s: probe pod %s sent no result", p.Spec.NodeName, p.Name))
				continue
			}
			rows = append(rows, row)
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			return rows, missing, nil
		}
		if err := sleep(ctx, poll); err != nil {
			return nil, nil, err
		}
	}
}

// deleteAndWait deletes the DaemonSet with foreground propagation and
// waits until it is gone, which is after its pods are.
func deleteAndWait(ctx context.Context, c *Client, name string, o Options) error {
	ctx, cancel := context.WithTimeout(ctx, o.Wait)
	defer cancel()
	if err := c.DeleteDaemonSet(ctx, name); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the probe DaemonSet %s/%s: %w", c.Namespace, name, err)
	}
	for {
		_, err := c.GetDaemonSet(ctx, name)
		if apierrors.IsNotFound(err) {
			o.Log.Info("deleted the probe DaemonSet and its pods", "name", name)
			return nil
		}
		if err := sleep(ctx, poll); err != nil {
			return fmt.Errorf("the probe DaemonSet %s/%s is still being deleted after %s, its pods terminating (a node down?): kubectl -n %s get pods -l %s=%s: %w",
				c.Namespace, name, o.Wait, c.Namespace, LabelRun, o.Spec.Run, err)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
