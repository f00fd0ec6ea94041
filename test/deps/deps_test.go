// Package deps checks the rules of weft's layout on the import graph, as
// `go list` reports it: no release binary links a test kit, registries and
// dataplanes meet only in the daemon, the CNI plugin reads only the data
// model, and netlink is called only from files built for Linux. It also
// checks that the tests test/run.sh's race pass skips by name are each one
// test of the module.
package deps

import (
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const mod = "github.com/weft-net/weft"

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
	GoFiles    []string
}

// list runs go list -json on patterns from the module root.
func list(t *testing.T, args ...string) []pkg {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v", args, err)
	}
	var ps []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return ps
}

// TestNoTestingInReleaseBinaries: weftd, weft, weftctl and install-conf
// link no package that imports testing (the test kits under
// internal/testkit among them), also in weftd's etcd-only build.
func TestNoTestingInReleaseBinaries(t *testing.T) {
	for _, tags := range []string{"", "weft_nokube"} {
		for _, p := range list(t, "-tags", tags, "./cmd/...") {
			for _, d := range p.Deps {
				if d == "testing" || strings.HasPrefix(d, mod+"/internal/testkit") {
					t.Errorf("%s (tags %q) links %s", p.ImportPath, tags, d)
				}
			}
		}
	}
}

// TestImportRules checks who may import whom (docs: README, Development).
func TestImportRules(t *testing.T) {
	registries := []string{mod + "/subnet/etcd", mod + "/subnet/kube"}
	for _, p := range list(t, "./...") {
		path := p.ImportPath
		in := func(prefix string) bool { return path == prefix || strings.HasPrefix(path, prefix+"/") }
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, mod+"/") {
				continue
			}
			switch {
			case strings.HasPrefix(imp, mod+"/cmd/"):
				t.Errorf("%s imports %s: nothing imports a command", path, imp)
			case in(mod+"/subnet") && !strings.HasPrefix(imp, mod+"/subnet"):
				t.Errorf("%s imports %s: the data model and the registries import only subnet", path, imp)
			case in(mod+"/backend") && slices.Contains(registries, imp):
				t.Errorf("%s imports the registry %s: registries and dataplanes meet only in the daemon", path, imp)
			case in(mod+"/backend") && strings.HasPrefix(imp, mod+"/backend/") && imp != mod+"/backend/kernel" &&
				imp != mod+"/backend/nft" && !strings.HasPrefix(path, imp):
				t.Errorf("%s imports the dataplane %s: dataplanes never import each other (they share backend/kernel and backend/nft)", path, imp)
			case in(mod+"/backend") && strings.HasPrefix(imp, mod+"/internal/"):
				t.Errorf("%s imports %s: dataplanes import only backend, vtep and subnet", path, imp)
			case path == mod+"/plugin" && imp != mod+"/subnet":
				t.Errorf("plugin imports %s: the CNI plugin reads only the subnet file", imp)
			case in(mod+"/internal/ops") && imp == mod+"/internal/daemon":
				t.Errorf("%s imports the daemon: operator tools read what weftd and the kernel hold", path)
			}
		}
	}
}

// TestNetlinkOnlyInLinuxFiles: netlink is called from _linux.go files
// only (tests aside).
func TestNetlinkOnlyInLinuxFiles(t *testing.T) {
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "vendor"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, "_linux.go"):
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), `"github.com/vishvananda/netlink`) {
			t.Errorf("%s imports netlink but is not a _linux.go file", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
