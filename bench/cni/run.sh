#!/usr/bin/env bash
# Benchmarks weft's CNI plugin against bridge+host-local: ADD+DEL cycles per
# second through libcni, interleaved in one run, test namespaces only. Needs
# root. Runs twice: against the reference plugins test/setup.sh installs
# (built with cgo, dynamically linked) and against static builds of the same
# version (CGO_ENABLED=0, as the upstream release binaries are built).
# Extra arguments go to `go test`, e.g. -benchtime=500x.
#
# Flannel's own CNI plugin is not on the Go module proxy; to compare with
# Flannel's chain, build it and name it in WEFT_BENCH_FLANNEL_CNI:
#   git clone https://github.com/flannel-io/cni-plugin /tmp/flannel-cni
#   (cd /tmp/flannel-cni && CGO_ENABLED=0 go build -o /tmp/flannel .)
#   sudo WEFT_BENCH_FLANNEL_CNI=/tmp/flannel bench/cni/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
test/setup.sh
# shellcheck source=/dev/null
. test/versions.env
static="$WEFT_CACHE/cni-plugins-static-$CNI_PLUGINS_VERSION"
if [ ! -x "$static/bridge" ] || [ ! -x "$static/host-local" ] || [ ! -x "$static/portmap" ] || [ ! -x "$static/loopback" ]; then
	echo "bench: building static reference CNI plugins $CNI_PLUGINS_VERSION into $static"
	mkdir -p "$static"
	(cd / && CGO_ENABLED=0 GOBIN="$static" GOFLAGS=-mod=mod go install \
		"github.com/containernetworking/plugins/plugins/main/bridge@$CNI_PLUGINS_VERSION" \
		"github.com/containernetworking/plugins/plugins/ipam/host-local@$CNI_PLUGINS_VERSION" \
		"github.com/containernetworking/plugins/plugins/meta/portmap@$CNI_PLUGINS_VERSION" \
		"github.com/containernetworking/plugins/plugins/main/loopback@$CNI_PLUGINS_VERSION")
fi
for ref in "$WEFT_CACHE/cni-plugins-$CNI_PLUGINS_VERSION" "$static"; do
	echo "== reference plugins: $ref"
	WEFT_CNI_BIN="$ref" go test -run '^$' -bench AddDel -benchtime=200x -count=1 "$@" ./bench/cni
done
