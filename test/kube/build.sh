#!/usr/bin/env bash
# Builds the real Kubernetes control plane that weft's Kubernetes-mode tests
# run: kube-apiserver and kube-controller-manager from k8s.io/kubernetes, and
# etcd at the version Kubernetes is released with. The binaries go into
# $WEFT_CACHE/kube-$KUBE_VERSION/ and are built only when absent there, so a
# warm machine never rebuilds them. A cold build takes 10-20 min on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
WEFT_CACHE="${WEFT_CACHE:-${HOME:-/root}/.cache/weft}"
KUBE_VERSION=v1.37.2 # keep in step with tools/go.mod and internal/testkit/kubetest
out="$WEFT_CACHE/kube-$KUBE_VERSION"
bins=(kube-apiserver kube-controller-manager etcd)

missing=0
for b in "${bins[@]}"; do
	[ -x "$out/$b" ] || missing=1
done
if [ "$missing" = 0 ]; then
	exit 0
fi

echo "kube/build.sh: building ${bins[*]} $KUBE_VERSION into $out (cold build: 10-20 min)"
minor="${KUBE_VERSION#v1.}"
minor="${minor%%.*}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
tmp="$(mktemp -d "$WEFT_CACHE/.kube-build.XXXXXX" 2>/dev/null || { mkdir -p "$WEFT_CACHE" && mktemp -d "$WEFT_CACHE/.kube-build.XXXXXX"; })"
trap 'rm -rf "$tmp"' EXIT
cd "$here/tools"
start=$(date +%s)
CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 19 go build -ldflags "$ldflags" -o "$tmp/" \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	./etcd
mkdir -p "$out"
for b in "${bins[@]}"; do
	mv "$tmp/$b" "$out/$b"
done
echo "kube/build.sh: built in $(($(date +%s) - start)) s"
