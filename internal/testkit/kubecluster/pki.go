package kubecluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the cluster's certificate authority; every component's client
// and serving certificate is signed by it, as kubeadm does.
type pki struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// CAFile is the CA certificate (PEM).
	CAFile string
	// CAKeyFile is the CA key (the controller-manager signs CSRs with it).
	CAKeyFile string
}

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("kubecluster: CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "weft-kubecluster-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("kubecluster: CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("kubecluster: CA: %w", err)
	}
	p := &pki{dir: dir, cert: cert, key: key, CAFile: filepath.Join(dir, "ca.crt"), CAKeyFile: filepath.Join(dir, "ca.key")}
	if err := writePEM(p.CAFile, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("kubecluster: CA key: %w", err)
	}
	return p, writePEM(p.CAKeyFile, "EC PRIVATE KEY", kder)
}

// issue writes <name>.crt and <name>.key: a certificate for the user cn in
// the groups orgs (a client), or for the ips and dnsNames (a server) when
// any are given.
func (p *pki) issue(name, cn string, orgs []string, ips []net.IP, dnsNames []string) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("kubecluster: key for %s: %w", name, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return "", "", fmt.Errorf("kubecluster: serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IPAddresses:  ips,
		DNSNames:     dnsNames,
	}
	if len(ips)+len(dnsNames) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		return "", "", fmt.Errorf("kubecluster: certificate for %s: %w", name, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", fmt.Errorf("kubecluster: key for %s: %w", name, err)
	}
	certFile, keyFile = filepath.Join(p.dir, name+".crt"), filepath.Join(p.dir, name+".key")
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	return certFile, keyFile, writePEM(keyFile, "EC PRIVATE KEY", kder)
}

// serviceAccountKey writes the RSA key the API server signs service-account
// tokens with.
func (p *pki) serviceAccountKey() (string, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", fmt.Errorf("kubecluster: service-account key: %w", err)
	}
	f := filepath.Join(p.dir, "sa.key")
	return f, writePEM(f, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key))
}

// kubeconfig writes a kubeconfig for the client certificate of name that
// talks to server.
func (p *pki) kubeconfig(path, server, name, cn string, orgs ...string) error {
	certFile, keyFile, err := p.issue(name, cn, orgs, nil, nil)
	if err != nil {
		return err
	}
	cfg := map[string]any{
		"apiVersion":      "v1",
		"kind":            "Config",
		"current-context": "weft",
		"clusters": []any{map[string]any{"name": "weft", "cluster": map[string]any{
			"server": server, "certificate-authority": p.CAFile,
		}}},
		"users": []any{map[string]any{"name": cn, "user": map[string]any{
			"client-certificate": certFile, "client-key": keyFile,
		}}},
		"contexts": []any{map[string]any{"name": "weft", "context": map[string]any{
			"cluster": "weft", "user": cn,
		}}},
	}
	b, err := json.MarshalIndent(cfg, "", "  ") // JSON is valid kubeconfig YAML
	if err != nil {
		return fmt.Errorf("kubecluster: kubeconfig %s: %w", path, err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	return nil
}

func writePEM(path, typ string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	return nil
}
