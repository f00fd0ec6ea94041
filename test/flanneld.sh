#!/usr/bin/env bash
# Builds flanneld $FLANNEL_VERSION (test/versions.env) once into
# $WEFT_CACHE/flanneld-$FLANNEL_VERSION/ from the Go module proxy's copy of
# github.com/flannel-io/flannel and prints its path. The proxy lacks one
# module that its tencentvpc backend needs, so that backend's import is
# dropped from main.go first (the tests run vxlan, host-gw and wireguard).
# It builds with cgo, as Flannel's releases do (its udp backend is cgo),
# against the machine's glibc (Debian 12, as the image test/cluster builds
# around it). Nothing of Flannel is kept in this repository: only these
# steps. Used by test/setup.sh (test/e2e's migration test) and
# test/cluster/flannel-images.sh.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=/dev/null
. "$repo/test/versions.env"
# shellcheck source=test/go.sh
. "$repo/test/go.sh"
dir="$WEFT_CACHE/flanneld-$FLANNEL_VERSION"
if [ ! -x "$dir/flanneld" ]; then
	echo "flanneld.sh: building flanneld $FLANNEL_VERSION into $dir (a few minutes, once)" >&2
	src=$(cd / && GOFLAGS=-mod=mod go mod download -json "github.com/flannel-io/flannel@$FLANNEL_VERSION" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
	if [ -z "$src" ] || [ ! -f "$src/main.go" ]; then
		echo "flanneld.sh: go mod download gave no source directory for flannel $FLANNEL_VERSION" >&2
		exit 1
	fi
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	cp -r "$src/." "$tmp/"
	chmod -R u+w "$tmp"
	sed -i '\#"github.com/flannel-io/flannel/pkg/backend/tencentvpc"#d' "$tmp/main.go"
	mkdir -p "$dir"
	(cd "$tmp" && GOFLAGS=-mod=mod go build \
		-ldflags "-X github.com/flannel-io/flannel/pkg/version.Version=$FLANNEL_VERSION" \
		-o "$dir/flanneld.tmp" .)
	mv "$dir/flanneld.tmp" "$dir/flanneld"
fi
echo "$dir/flanneld"
