package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// startAPIServer runs kube-apiserver against etcdURL with token
// authentication for the admin, a service-account signing key (so that the
// TokenRequest API works) and Node,RBAC authorization.
func (c *Cluster) startAPIServer(ctx context.Context, t testing.TB, etcdURL string) error {
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	token, err := c.writeCredentials()
	if err != nil {
		return err
	}
	certDir := filepath.Join(c.Dir, "apiserver-certs")
	saKey := filepath.Join(c.Dir, "sa.key")
	p, err := startProcess(t, c.Dir, "kube-apiserver", filepath.Join(c.bin, "kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[0]),
		"--cert-dir="+certDir,
		"--token-auth-file="+filepath.Join(c.Dir, "tokens.csv"),
		"--service-account-key-file="+saKey,
		"--service-account-signing-key-file="+saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=Node,RBAC",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--allow-privileged=true",
		"--v=1",
	)
	if err != nil {
		return err
	}
	host := "https://127.0.0.1:" + strconv.Itoa(ports[0])
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	ready := func(ctx context.Context) error {
		return httpGet(ctx, host+"/readyz", func(r *http.Request) (*http.Client, error) {
			r.Header.Set("Authorization", "Bearer "+token)
			return insecure, nil
		})
	}
	if err := waitFor(ctx, p, ready); err != nil {
		return fmt.Errorf("kubetest: kube-apiserver not ready: %w (log: %s)", err, p.logTail())
	}
	ca, err := os.ReadFile(filepath.Join(certDir, "apiserver.crt"))
	if err != nil {
		return fmt.Errorf("kubetest: read the API server certificate: %w", err)
	}
	c.Admin = &rest.Config{Host: host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
	if c.Client, err = kubernetes.NewForConfig(c.Admin); err != nil {
		return fmt.Errorf("kubetest: admin client: %w", err)
	}
	if _, err := c.Client.Discovery().ServerVersion(); err != nil {
		return fmt.Errorf("kubetest: check the admin client: %w", err)
	}
	return c.writeKubeconfig(host, token, ca)
}

// writeCredentials writes the service-account signing key and the static
// token file with one admin token, which it returns.
func (c *Cluster) writeCredentials() (string, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", fmt.Errorf("kubetest: generate the service-account key: %w", err)
	}
	der := x509.MarshalPKCS1PrivateKey(key)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: der})
	if err := os.WriteFile(filepath.Join(c.Dir, "sa.key"), keyPEM, 0o600); err != nil {
		return "", fmt.Errorf("kubetest: write the service-account key: %w", err)
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("kubetest: generate the admin token: %w", err)
	}
	token := hex.EncodeToString(b)
	line := token + `,kubetest-admin,kubetest-admin,"system:masters"` + "\n"
	if err := os.WriteFile(filepath.Join(c.Dir, "tokens.csv"), []byte(line), 0o600); err != nil {
		return "", fmt.Errorf("kubetest: write the token file: %w", err)
	}
	return token, nil
}

// writeKubeconfig writes the admin kubeconfig used by the controller-manager
// (JSON is valid kubeconfig YAML).
func (c *Cluster) writeKubeconfig(host, token string, ca []byte) error {
	cfg := map[string]any{
		"apiVersion":      "v1",
		"kind":            "Config",
		"current-context": "kubetest",
		"clusters": []any{map[string]any{"name": "kubetest", "cluster": map[string]any{
			"server": host, "certificate-authority-data": ca,
		}}},
		"users": []any{map[string]any{"name": "admin", "user": map[string]any{"token": token}}},
		"contexts": []any{map[string]any{"name": "kubetest", "context": map[string]any{
			"cluster": "kubetest", "user": "admin",
		}}},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("kubetest: encode the kubeconfig: %w", err)
	}
	c.kubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	if err := os.WriteFile(c.kubeconfig, b, 0o600); err != nil {
		return fmt.Errorf("kubetest: write the kubeconfig: %w", err)
	}
	return nil
}

// Kubeconfig returns the path of a kubeconfig file for the admin.
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// httpGet fetches url and fails unless the status is 200. prepare may set
// headers and choose the client.
func httpGet(ctx context.Context, url string, prepare func(*http.Request) (*http.Client, error)) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	client := http.DefaultClient
	if prepare != nil {
		if client, err = prepare(req); err != nil {
			return err
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return nil
}
