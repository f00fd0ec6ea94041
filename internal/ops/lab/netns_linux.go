package lab

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/weft-net/weft/internal/namespace"
)

// createNS, OpenNS and deleteNS name the lab's namespaces exactly (the
// lab's prefix is its ownership mark); nettest does the work.
func createNS(name string) (*namespace.NS, error) { return namespace.CreateNamed(name) }

// OpenNS opens an existing lab namespace with a netlink handle bound to it;
// the caller closes the handle.
func OpenNS(name string) (*namespace.NS, error) { return namespace.OpenNamed(name) }

func deleteNS(name string) error { return namespace.DeleteNamed(name) }

// ownedNamespaces lists the names under /run/netns that the lab with the
// given prefix made.
func ownedNamespaces(prefix string) ([]string, error) {
	entries, err := os.ReadDir(namespace.RunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) && OwnsNamespace(prefix, e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
