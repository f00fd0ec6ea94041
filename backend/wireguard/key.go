package wireguard

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// DefaultKeyFile is where Flannel keeps the node's private key; the
// variable KeyFileEnv overrides it.
const (
	DefaultKeyFile = "/run/flannel/wgkey"
	KeyFileEnv     = "WIREGUARD_KEY_FILE"
)

// KeyFile is $WIREGUARD_KEY_FILE, else DefaultKeyFile.
func KeyFile() string {
	if p, ok := os.LookupEnv(KeyFileEnv); ok && p != "" {
		return p
	}
	return DefaultKeyFile
}

// LoadOrCreateKey reads the private key from path (base64, as `wg genkey`
// prints it and as Flannel writes it), or creates it there with mode 0400
// when the file does not exist. It reports whether it created the key.
func LoadOrCreateKey(path string) (wgtypes.Key, bool, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		k, err := wgtypes.ParseKey(strings.TrimSpace(string(b)))
		if err != nil {
			return wgtypes.Key{}, false, fmt.Errorf("wireguard key file %s: %w", path, err)
		}
		return k, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return wgtypes.Key{}, false, fmt.Errorf("wireguard key file: %w", err)
	}
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, false, fmt.Errorf("generate wireguard key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return wgtypes.Key{}, false, fmt.Errorf("wireguard key file: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return wgtypes.Key{}, false, fmt.Errorf("wireguard key file: %w", err)
	}
	if _, err := f.WriteString(k.String()); err != nil {
		f.Close()
		return wgtypes.Key{}, false, fmt.Errorf("wireguard key file %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return wgtypes.Key{}, false, fmt.Errorf("wireguard key file %s: %w", path, err)
	}
	return k, true, nil
}
