// Command size builds weft's binaries as docs/install.md says
// (CGO_ENABLED=0 go build) and writes their sizes, with the commit built,
// into the report section of bench/size/README.md:
//
//	go run ./bench/size
package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/weft-net/weft/internal/testkit/benchreport"
)

// builds are the binaries measured: the name shown, the build tags, the package.
var builds = []struct{ name, tags, pkg string }{
	{"weftd", "", "./cmd/weftd"},
	{"weftd without the Kubernetes client (-tags weft_nokube)", "weft_nokube", "./cmd/weftd"},
	{"weftctl", "", "./cmd/weftctl"},
	{"weft (CNI plugin)", "", "./cmd/weft"},
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "size:", err)
		os.Exit(1)
	}
}

func run() error {
	root, err := benchreport.Root()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "weft-size")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	st := benchreport.NewStamp(root, "binaries", "go run ./bench/size", "cmd", "internal/daemon", "internal/etcdlocal", "internal/fdstore", "internal/flagenv", "internal/namespace", "internal/ops",
		"backend", "subnet", "plugin", "policy", "flow", "vtep", "go.mod")
	stamp, err := st.Markdown(root)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\n%s, %s/%s, `CGO_ENABLED=0 go build`:\n\n| binary | size |\n|---|---|\n", stamp, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	for i, bd := range builds {
		out := filepath.Join(tmp, fmt.Sprint(i))
		cmd := exec.Command("go", "build", "-tags", bd.tags, "-o", out, bd.pkg)
		cmd.Dir, cmd.Stderr = root, os.Stderr
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go build %s: %w", bd.pkg, err)
		}
		fi, err := os.Stat(out)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "| %s | %.1f MB |\n", bd.name, float64(fi.Size())/1e6)
	}
	os.Stdout.Write(b.Bytes())
	return benchreport.WriteSection(filepath.Join(root, "bench/size/README.md"), "size", "binaries", b.Bytes())
}
