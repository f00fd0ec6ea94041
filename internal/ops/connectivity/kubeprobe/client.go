package kubeprobe

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/weft-net/weft/internal/ops/kuberest"
)

// Client is what a run needs of the Kubernetes API in one namespace: its
// probe DaemonSet and the DaemonSet's pods. It speaks to two REST clients
// whose scheme knows only the core/v1 and apps/v1 types, as subnet/kube's
// Node client does, so weftctl does not link every API group's types.
type Client struct {
	Namespace string
	core      *rest.RESTClient
	apps      *rest.RESTClient
	pc        runtime.ParameterCodec
}

// NewClient returns a client for namespace.
func NewClient(cfg *rest.Config, namespace string) (*Client, error) {
	scheme, err := kuberest.Scheme(corev1.AddToScheme, appsv1.AddToScheme)
	if err != nil {
		return nil, err
	}
	c := &Client{Namespace: namespace, pc: runtime.NewParameterCodec(scheme)}
	if c.core, err = kuberest.Client(cfg, scheme, "/api", corev1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	if c.apps, err = kuberest.Client(cfg, scheme, "/apis", appsv1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	return c, nil
}

// CreateDaemonSet creates ds in the client's namespace.
func (c *Client) CreateDaemonSet(ctx context.Context, ds *appsv1.DaemonSet) (*appsv1.DaemonSet, error) {
	out := &appsv1.DaemonSet{}
	err := c.apps.Post().Namespace(c.Namespace).Resource("daemonsets").Body(ds).Do(ctx).Into(out)
	return out, err
}

// GetDaemonSet reads the DaemonSet name.
func (c *Client) GetDaemonSet(ctx context.Context, name string) (*appsv1.DaemonSet, error) {
	out := &appsv1.DaemonSet{}
	err := c.apps.Get().Namespace(c.Namespace).Resource("daemonsets").Name(name).Do(ctx).Into(out)
	return out, err
}

// ListDaemonSets lists the DaemonSets matching the label selector.
func (c *Client) ListDaemonSets(ctx context.Context, selector string) (*appsv1.DaemonSetList, error) {
	out := &appsv1.DaemonSetList{}
	opts := metav1.ListOptions{LabelSelector: selector}
	err := c.apps.Get().Namespace(c.Namespace).Resource("daemonsets").VersionedParams(&opts, c.pc).Do(ctx).Into(out)
	return out, err
}

// DeleteDaemonSet deletes the DaemonSet name; with foreground propagation
// it stays (with a deletion timestamp) until its pods are gone.
func (c *Client) DeleteDaemonSet(ctx context.Context, name string) error {
	fg := metav1.DeletePropagationForeground
	return c.apps.Delete().Namespace(c.Namespace).Resource("daemonsets").Name(name).
		Body(&metav1.DeleteOptions{PropagationPolicy: &fg}).Do(ctx).Error()
}

// ListPods lists the pods matching the label selector.
func (c *Client) ListPods(ctx context.Context, selector string) (*corev1.PodList, error) {
	out := &corev1.PodList{}
	opts := metav1.ListOptions{LabelSelector: selector}
	err := c.core.Get().Namespace(c.Namespace).Resource("pods").VersionedParams(&opts, c.pc).Do(ctx).Into(out)
	return out, err
}

// GetPod reads the pod name.
func (c *Client) GetPod(ctx context.Context, name string) (*corev1.Pod, error) {
	out := &corev1.Pod{}
	err := c.core.Get().Namespace(c.Namespace).Resource("pods").Name(name).Do(ctx).Into(out)
	return out, err
}

// Annotate sets one annotation on the pod name with a JSON merge patch.
func (c *Client) Annotate(ctx context.Context, pod, key, value string) error {
	patch, err := jsonMarshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	if err != nil {
		return err
	}
	return c.core.Patch(types.MergePatchType).Namespace(c.Namespace).Resource("pods").Name(pod).Body(patch).Do(ctx).Error()
}
