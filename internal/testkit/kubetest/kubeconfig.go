package kubetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ServiceAccountKubeconfig writes a kubeconfig file into dir that
// authenticates as the ServiceAccount namespace/name, and returns its path.
func (c *Cluster) ServiceAccountKubeconfig(ctx context.Context, dir, namespace, name string) (string, error) {
	cfg, err := c.ServiceAccountConfig(ctx, namespace, name)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, namespace+"-"+name+".kubeconfig")
	return path, WriteKubeconfig(cfg, path)
}

// WriteKubeconfig writes cfg's server, CA and bearer token as a kubeconfig
// file.
func WriteKubeconfig(cfg *rest.Config, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["k"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["k"] = &clientcmdapi.Context{Cluster: "k", AuthInfo: "u"}
	kc.CurrentContext = "k"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("kubetest: write %s: %w", path, err)
	}
	return os.Chmod(path, 0o600)
}
