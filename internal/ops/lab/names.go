package lab

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// DefaultStateDir is the state directory of `weftctl lab` when none is given.
const DefaultStateDir = "/run/weft-lab"

// BasePrefix starts the name of every namespace a lab creates. It differs
// from the tests' "wefttest-" so that neither sweeps the other's namespaces.
const BasePrefix = "weftlab-"

// Prefix returns the namespace prefix of the lab whose state directory is
// dir: BasePrefix for DefaultStateDir, BasePrefix + 6 hex digits of the
// directory's hash + "-" for any other.
func Prefix(dir string) string {
	dir = filepath.Clean(dir)
	if dir == DefaultStateDir {
		return BasePrefix
	}
	h := sha256.Sum256([]byte(dir))
	return BasePrefix + hex.EncodeToString(h[:3]) + "-"
}

// SwitchName is the short name of the underlay switch's namespace.
const SwitchName = "sw"

// NodeName is the short name of node i (1-based): "node1".
func NodeName(i int) string { return "node" + strconv.Itoa(i) }

// PodName is the short name of pod j (1-based) on node i: "node1-pod2".
func PodName(i, j int) string { return fmt.Sprintf("node%d-pod%d", i, j) }

var shortName = regexp.MustCompile(`^(sw|node([1-9][0-9]*)(-pod([1-9][0-9]*))?)$`)

// ParseName splits a short name into its node and pod numbers (pod 0 for a
// node, node 0 and pod 0 for the switch). ok is false for anything else.
func ParseName(name string) (node, pod int, ok bool) {
	m := shortName.FindStringSubmatch(name)
	if m == nil {
		return 0, 0, false
	}
	if m[1] == SwitchName {
		return 0, 0, true
	}
	node, _ = strconv.Atoi(m[2])
	if m[4] != "" {
		pod, _ = strconv.Atoi(m[4])
	}
	return node, pod, true
}

// OwnsNamespace reports whether the namespace name was made by the lab with
// the given prefix: the prefix followed by exactly a short name. The default
// lab ("weftlab-") therefore never claims "weftlab-3fa2c1-node1".
func OwnsNamespace(prefix, nsName string) bool {
	rest, ok := strings.CutPrefix(nsName, prefix)
	if !ok {
		return false
	}
	_, _, ok = ParseName(rest)
	return ok
}
