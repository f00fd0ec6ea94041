#!/usr/bin/env bash
# Builds the real Kubernetes binaries that weft's Kubernetes-mode tests run:
# kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet
# and kubectl from k8s.io/kubernetes (the last three for the real cluster of
# test/cluster), and etcd at the version Kubernetes is released with. The binaries go into
# $WEFT_CACHE/kube-$KUBE_VERSION/ and only those absent there are built, so a
# warm machine never rebuilds them. A cold build takes 10-20 min on 2 cores
# (kube-proxy alone a few minutes; kubelet, kube-scheduler and kubectl a few
# more with the others' build cache warm).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
WEFT_CACHE="${WEFT_CACHE:-${HOME:-/root}/.cache/weft}"
KUBE_VERSION=v1.37.2 # keep in step with tools/go.mod and internal/testkit/kubetest
out="$WEFT_CACHE/kube-$KUBE_VERSION"
# binary name -> package in the tools module
declare -A pkgs=(
	[kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
	[kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
	[kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
	[kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
	[kubelet]=k8s.io/kubernetes/cmd/kubelet
	[kubectl]=k8s.io/kubernetes/cmd/kubectl
	[etcd]=./etcd
)

missing=()
for b in "${!pkgs[@]}"; do
	[ -x "$out/$b" ] || missing+=("$b")
done
if [ "${#missing[@]}" = 0 ]; then
	exit 0
fi

echo "kube/build.sh: building ${missing[*]} $KUBE_VERSION into $out (cold build of all: 10-20 min)"
minor="${KUBE_VERSION#v1.}"
minor="${minor%%.*}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
tmp="$(mktemp -d "$WEFT_CACHE/.kube-build.XXXXXX" 2>/dev/null || { mkdir -p "$WEFT_CACHE" && mktemp -d "$WEFT_CACHE/.kube-build.XXXXXX"; })"
trap 'rm -rf "$tmp"' EXIT
cd "$here/tools"
start=$(date +%s)
targets=()
for b in "${missing[@]}"; do
	targets+=("${pkgs[$b]}")
done
CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 19 go build -ldflags "$ldflags" -o "$tmp/" "${targets[@]}"
mkdir -p "$out"
for b in "${missing[@]}"; do
	mv "$tmp/$b" "$out/$b"
done
echo "kube/build.sh: built in $(($(date +%s) - start)) s"
