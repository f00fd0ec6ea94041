package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
)

// State is lab.json: everything a lab built, so that Down, Status, Exec and
// the debris sweep find it without asking the process that built it.
type State struct {
	Prefix   string      `json:"prefix"`
	Proc     Proc        `json:"proc"` // the `lab up` process
	Etcd     string      `json:"etcd"` // client endpoint, unix://<state>/etcd.sock
	EtcdPfx  string      `json:"etcdPrefix"`
	Network  string      `json:"network"`
	Underlay string      `json:"underlay"` // the underlay subnet
	Switch   string      `json:"switch"`   // namespace of the underlay switch
	Nodes    []NodeState `json:"nodes"`
	Pods     []PodState  `json:"pods"`
	Ready    bool        `json:"ready"` // every weftd ready and every pod wired
}

// NodeState is one node.
type NodeState struct {
	Name       string     `json:"name"` // "node1"
	NS         string     `json:"netns"`
	Addr       netip.Addr `json:"addr"` // underlay address of eth0
	Backend    string     `json:"backend"`
	SubnetFile string     `json:"subnetFile"`
	Log        string     `json:"log"`
	Weftd      Proc       `json:"weftd"`
}

// PodState is one pod.
type PodState struct {
	Name string     `json:"name"` // "node1-pod1"
	Node string     `json:"node"`
	NS   string     `json:"netns"`
	IP   netip.Addr `json:"ip"`
}

// Names returns every namespace the state records.
func (s *State) Names() []string {
	var out []string
	if s.Switch != "" {
		out = append(out, s.Switch)
	}
	for _, n := range s.Nodes {
		out = append(out, n.NS)
	}
	for _, p := range s.Pods {
		out = append(out, p.NS)
	}
	return out
}

// Node returns the node with the given short name.
func (s *State) Node(name string) (NodeState, bool) {
	i := slices.IndexFunc(s.Nodes, func(n NodeState) bool { return n.Name == name })
	if i < 0 {
		return NodeState{}, false
	}
	return s.Nodes[i], true
}

// Pod returns the pod with the given short name.
func (s *State) Pod(name string) (PodState, bool) {
	i := slices.IndexFunc(s.Pods, func(p PodState) bool { return p.Name == name })
	if i < 0 {
		return PodState{}, false
	}
	return s.Pods[i], true
}

// NamespaceOf returns the namespace of a node or pod by short name.
func (s *State) NamespaceOf(name string) (string, error) {
	if n, ok := s.Node(name); ok {
		return n.NS, nil
	}
	if p, ok := s.Pod(name); ok {
		return p.NS, nil
	}
	if name == SwitchName && s.Switch != "" {
		return s.Switch, nil
	}
	var names []string
	for _, n := range s.Nodes {
		names = append(names, n.Name)
	}
	for _, p := range s.Pods {
		names = append(names, p.Name)
	}
	return "", fmt.Errorf("no node or pod %q in the lab (have: %v)", name, names)
}

const stateFile = "lab.json"

// ErrNoLab is returned by LoadState when the state directory holds no lab.
var ErrNoLab = errors.New("no lab")

// LoadState reads dir/lab.json.
func LoadState(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("load lab state: %w in %s", ErrNoLab, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("load lab state: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("load lab state %s: %w", filepath.Join(dir, stateFile), err)
	}
	return &s, nil
}

// Save writes dir/lab.json atomically.
func (s *State) Save(dir string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("save lab state: %w", err)
	}
	tmp := filepath.Join(dir, "."+stateFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("save lab state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, stateFile)); err != nil {
		return fmt.Errorf("save lab state: %w", err)
	}
	return nil
}

// removeFiles removes what a lab writes in its state directory, and only
// that, so a --state-dir pointing at a directory with other files is safe.
func removeFiles(dir string) error {
	var errs []error
	for _, name := range []string{stateFile, "." + stateFile + ".tmp", "etcd.sock", "data", "nodes"} {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
