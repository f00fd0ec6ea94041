package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Nodes is all the registry needs of the Kubernetes API: the Node methods
// of client-go's typed core/v1 client, with the same signatures, so both
// clientset.CoreV1().Nodes() (a fake one in tests) and the client of
// NewClient serve. A client whose watch cannot stream the initial list
// (client-go's fake) also has IsWatchListSemanticsUnSupported() returning
// true, which the informer asks for.
type Nodes interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error)
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Node, error)
	PatchStatus(ctx context.Context, nodeName string, data []byte) (*corev1.Node, error)
}

// NewClient returns a Nodes client for the kubeconfig at path, or for the
// in-cluster service account when path is empty.
//
// It is a REST client of the core/v1 group whose scheme knows only the Node
// types, speaking protobuf. client-go's clientset (and even its typed core/v1
// client, through the shared scheme) registers every API group's types,
// which made them most of weftd's executable; weft only reads and patches
// Nodes.
func NewClient(kubeconfigPath string) (Nodes, error) {
	return NewClientURL("", kubeconfigPath)
}

// NewClientURL is NewClient with the API server's URL overriding the one in
// the kubeconfig (flanneld's --kube-api-url); with neither a URL nor a
// kubeconfig it uses the pod's in-cluster config.
func NewClientURL(apiURL, kubeconfigPath string) (Nodes, error) {
	cfg, err := RESTConfig(apiURL, kubeconfigPath)
	if err != nil {
		return nil, err
	}
	return NewClientForConfig(cfg)
}

// RESTConfig is the client configuration NewClientURL uses: the kubeconfig
// at kubeconfigPath with apiURL overriding its server, or the pod's
// in-cluster config when both are empty.
func RESTConfig(apiURL, kubeconfigPath string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfigPath == "" && apiURL == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags(apiURL, kubeconfigPath)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	return cfg, nil
}

// NewClientForConfig returns a Nodes client for cfg (which it does not
// change).
func NewClientForConfig(cfg *rest.Config) (Nodes, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	if c.UserAgent == "" {
		c.UserAgent = "weftd"
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return &nodeClient{rc: rc, pc: runtime.NewParameterCodec(scheme)}, nil
}

// nodeClient is Nodes on a core/v1 REST client.
type nodeClient struct {
	rc *rest.RESTClient
	pc runtime.ParameterCodec
}

var _ Nodes = (*nodeClient)(nil)

func (c *nodeClient) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error) {
	n := &corev1.Node{}
	err := c.rc.Get().Resource("nodes").Name(name).VersionedParams(&opts, c.pc).Do(ctx).Into(n)
	return n, err
}

func (c *nodeClient) List(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error) {
	l := &corev1.NodeList{}
	err := c.rc.Get().Resource("nodes").VersionedParams(&opts, c.pc).Do(ctx).Into(l)
	return l, err
}

func (c *nodeClient) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.rc.Get().Resource("nodes").VersionedParams(&opts, c.pc).Watch(ctx)
}

func (c *nodeClient) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Node, error) {
	n := &corev1.Node{}
	err := c.rc.Patch(pt).Resource("nodes").Name(name).SubResource(subresources...).
		VersionedParams(&opts, c.pc).Body(data).Do(ctx).Into(n)
	return n, err
}

func (c *nodeClient) PatchStatus(ctx context.Context, nodeName string, data []byte) (*corev1.Node, error) {
	return c.Patch(ctx, nodeName, types.StrategicMergePatchType, data, metav1.PatchOptions{}, "status")
}

// PodNodeName returns the node a pod is bound to (spec.nodeName), read with
// the client n returned by NewClient: weftd started as flanneld, without
// NODE_NAME, finds its node through its own pod (POD_NAMESPACE, POD_NAME),
// as flanneld does. It reads the pod as JSON and keeps only that field, so
// the client stays one of Nodes.
func PodNodeName(ctx context.Context, n Nodes, namespace, name string) (string, error) {
	c, ok := n.(*nodeClient)
	if !ok {
		return "", errors.New("node name from the pod: not a client made by NewClient")
	}
	b, err := c.rc.Get().AbsPath("/api/v1/namespaces", namespace, "pods", name).
		SetHeader("Accept", runtime.ContentTypeJSON).DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("node name: get pod %s/%s: %w", namespace, name, err)
	}
	var pod struct {
		Spec struct {
			NodeName string `json:"nodeName"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(b, &pod); err != nil {
		return "", fmt.Errorf("node name: pod %s/%s: %w", namespace, name, err)
	}
	if pod.Spec.NodeName == "" {
		return "", fmt.Errorf("node name: pod %s/%s is not scheduled", namespace, name)
	}
	return pod.Spec.NodeName, nil
}
