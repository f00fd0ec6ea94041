package kubeprobe

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/weft-net/weft/internal/ops/connectivity"
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

// Result is a run's outcome: a matrix per kind of probe (pod to pod, node
// to node), the probes that did not take part, and notes.
type Result struct {
	Matrices []*connectivity.Matrix
	Missing  []string // one line per probe that was not ready or sent no result
	Notes    []string // nodes not measured by design (no overlay device)
}

// Failures counts the failed pairs and the missing probes.
func (r *Result) Failures() int {
	n := len(r.Missing)
	for _, m := range r.Matrices {
		n += m.Failures()
	}
	return n
}

// Render prints the matrices, the missing probes and the notes.
func (r *Result) Render(w io.Writer) error {
	for _, m := range r.Matrices {
		if err := m.Render(w); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	for _, m := range r.Missing {
		fmt.Fprintf(w, "✗ %s\n", m)
	}
	for _, m := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", m)
	}
	if len(r.Missing) > 0 {
		_, err := fmt.Fprintf(w, "%d probe(s) did not take part: their nodes are not in the matrix\n", len(r.Missing))
		return err
	}
	return nil
}

// set is one probe DaemonSet of a run and what it yields.
type set struct {
	spec    Spec
	title   string
	ready   []corev1.Pod
	targets []Target
}

// Run creates the probe DaemonSets (one on the pod network, one on the
// nodes' network), waits for their pods, has them measure each other,
// collects their rows and deletes the DaemonSets (also when ctx is
// cancelled), waiting until their pods are gone.
func Run(ctx context.Context, c *Client, o Options) (res *Result, err error) {
	warnLeftovers(ctx, c, o.Log)
	host := o.Spec
	host.Host = true
	sets := []*set{
		{spec: o.Spec, title: "Pod to pod (probe DaemonSet %s/%s, a pod per node):"},
		{spec: host, title: "Node to node (VTEP addresses over the overlay; probe DaemonSet %s/%s on the nodes' network):"},
	}
	var created []string
	defer func() {
		// A DaemonSet left behind is reported, not failed on: the
		// measurements stand, and a node that is down keeps its pod
		// terminating until it returns.
		if derr := deleteAndWait(context.WithoutCancel(ctx), c, created, o); derr != nil {
			o.Log.Warn("cleanup", "err", derr)
		}
	}()
	for _, s := range sets {
		ds, err := c.CreateDaemonSet(ctx, s.spec.DaemonSet())
		if err != nil {
			return nil, fmt.Errorf("create the probe DaemonSet in namespace %s: %w (kube-manifests/weft-connectivity.yml creates the namespace, the probes' ServiceAccount and the Role weftctl needs)", c.Namespace, err)
		}
		o.Log.Info("created a probe DaemonSet", "namespace", c.Namespace, "name", ds.Name)
		created = append(created, ds.Name)
	}
	res = &Result{}
	for _, s := range sets {
		var notReady, notes []string
		s.ready, s.targets, notReady, notes, err = waitReady(ctx, c, s.spec, o)
		if err != nil {
			return nil, err
		}
		res.Missing, res.Notes = append(res.Missing, notReady...), append(res.Notes, notes...)
	}
	for _, s := range sets {
		if err := handOut(ctx, c, s); err != nil {
			return nil, err
		}
	}
	o.Log.Info("probes measuring", "pods", len(sets[0].ready), "nodes", len(sets[1].ready))
	for _, s := range sets {
		// Each probe measures the others in turn: count echo requests
		// and one TCP exchange per peer, each up to Timeout.
		measuring := time.Duration(len(s.ready)) * time.Duration(o.Spec.Count+1) * o.Timeout
		rows, missing, err := collect(ctx, c, s.ready, s.spec.Selector(), o.Wait+measuring)
		if err != nil {
			return nil, err
		}
		m := &connectivity.Matrix{Title: fmt.Sprintf(s.title, c.Namespace, s.spec.Name())}
		for _, r := range rows {
			m.Pairs = append(m.Pairs, connectivity.FromJSON(r.Pods)...)
		}
		res.Matrices, res.Missing = append(res.Matrices, m), append(res.Missing, missing...)
	}
	return res, nil
}

// handOut gives every ready probe of s the list of all of them.
func handOut(ctx context.Context, c *Client, s *set) error {
	b, err := json.Marshal(s.targets)
	if err != nil {
		return err
	}
	for _, p := range s.ready {
		if err := c.Annotate(ctx, p.Name, AnnotationTargets, string(b)); err != nil {
			return fmt.Errorf("hand the targets to probe %s: %w", p.Name, err)
		}
	}
	return nil
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

// waitReady waits until every pod the DaemonSet wants is ready with an
// address, or until o.Wait passes; it returns the ready pods (ordered by
// node) with their targets, a line for each pod that is not ready, and a
// note for each host probe without an overlay device.
func waitReady(ctx context.Context, c *Client, spec Spec, o Options) ([]corev1.Pod, []Target, []string, []string, error) {
	deadline := time.Now().Add(o.Wait)
	for {
		ds, err := c.GetDaemonSet(ctx, spec.Name())
		if err != nil {
			return nil, nil, nil, nil, fmt.Errorf("read the probe DaemonSet: %w", err)
		}
		pods, err := c.ListPods(ctx, spec.Selector())
		if err != nil {
			return nil, nil, nil, nil, fmt.Errorf("list the probe pods: %w", err)
		}
		ready, targets, notReady, notes := splitReady(pods.Items, spec.Host)
		want := int(ds.Status.DesiredNumberScheduled)
		settled := ds.Status.ObservedGeneration >= ds.Generation && want > 0
		if settled && len(ready)+len(notes) >= want {
			return ready, targets, nil, notes, nil
		}
		if time.Now().After(deadline) {
			if n := len(ready) + len(notReady) + len(notes); n < want {
				notReady = append(notReady, fmt.Sprintf("%s: the DaemonSet wants %d pods, %d exist (see its events)", spec.Name(), want, n))
			}
			if len(ready) == 0 && !spec.Host {
				return nil, nil, nil, nil, fmt.Errorf("no probe pod ready within --wait %s (the DaemonSet wants %d): %v", o.Wait, want, notReady)
			}
			return ready, targets, notReady, notes, nil
		}
		if err := sleep(ctx, poll); err != nil {
			return nil, nil, nil, nil, err
		}
	}
}

// splitReady sorts the live pods into ready (with the address the others
// measure) and not. A host probe is ready once it says where it listens;
// one without an overlay device is a note.
func splitReady(pods []corev1.Pod, host bool) (ready []corev1.Pod, targets []Target, notReady, notes []string) {
	sort.Slice(pods, func(i, j int) bool { return pods[i].Spec.NodeName < pods[j].Spec.NodeName })
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		addr := p.Status.PodIP
		if host {
			addr = p.Annotations[AnnotationEndpoint]
		}
		if why, ok := strings.CutPrefix(addr, "none: "); ok && host {
			notes = append(notes, fmt.Sprintf("node %s: not measured node to node: %s", p.Spec.NodeName, why))
			continue
		}
		if isReady(p) && addr != "" && p.Spec.NodeName != "" {
			ready = append(ready, p)
			targets = append(targets, Target{Node: p.Spec.NodeName, IP: addr})
			continue
		}
		notReady = append(notReady, notReadyLine(p))
	}
	sort.Strings(notReady)
	return ready, targets, notReady, notes
}

func notReadyLine(p corev1.Pod) string {
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
	return fmt.Sprintf("node %s: probe pod %s not ready (%s)", node, p.Name, why)
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

// deleteAndWait deletes the DaemonSets with foreground propagation and
// waits until they are gone, which is after their pods are.
func deleteAndWait(ctx context.Context, c *Client, names []string, o Options) error {
	ctx, cancel := context.WithTimeout(ctx, o.Wait)
	defer cancel()
	for _, name := range names {
		if err := c.DeleteDaemonSet(ctx, name); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete the probe DaemonSet %s/%s: %w", c.Namespace, name, err)
		}
	}
	for _, name := range names {
		for {
			_, err := c.GetDaemonSet(ctx, name)
			if apierrors.IsNotFound(err) {
				o.Log.Info("deleted a probe DaemonSet and its pods", "name", name)
				break
			}
			if err := sleep(ctx, poll); err != nil {
				return fmt.Errorf("the probe DaemonSet %s/%s is still being deleted after %s, its pods terminating (a node down?): kubectl -n %s get pods -l %s=%s: %w",
					c.Namespace, name, o.Wait, c.Namespace, LabelRun, o.Spec.Run, err)
			}
		}
	}
	return nil
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
