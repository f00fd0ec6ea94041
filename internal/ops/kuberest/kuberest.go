// Package kuberest builds the small Kubernetes REST clients weftctl's
// operations use: a client of one API group version whose scheme knows
// only the types it is given, so weftctl does not link every API group's
// types (as subnet/kube's Node client does).
package kuberest

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// Scheme returns a scheme that knows the types the add functions register
// (such as corev1.AddToScheme) and the meta/v1 options types.
func Scheme(adds ...func(*runtime.Scheme) error) (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	for _, add := range adds {
		if err := add(scheme); err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
	}
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	return scheme, nil
}

// Client returns a JSON REST client of the group version gv served under
// apiPath ("/api" for core/v1, "/apis" for the others) that decodes with
// scheme. It copies cfg, and names itself weftctl unless cfg has a user
// agent.
func Client(cfg *rest.Config, scheme *runtime.Scheme, apiPath string, gv schema.GroupVersion) (*rest.RESTClient, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = apiPath
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	c.ContentType = runtime.ContentTypeJSON
	if c.UserAgent == "" {
		c.UserAgent = "weftctl"
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return rc, nil
}
