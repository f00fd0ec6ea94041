#!/usr/bin/env bash
# Builds e2e.test, Kubernetes' own end-to-end suite at KUBE_VERSION, from the
# tools module (go test -c k8s.io/kubernetes/test/e2e; tools/tools_e2e.go
# keeps the suite's test-only modules in its go.mod), into
# $WEFT_CACHE/kube-$KUBE_VERSION/e2e.test, which test/cluster/e2e.sh runs
# against the real cluster of test/cluster. Nothing happens when the binary is
# there. With the build cache of ./build.sh warm it takes a few minutes more.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
WEFT_CACHE="${WEFT_CACHE:-${HOME:-/root}/.cache/weft}"
KUBE_VERSION=v1.37.2 # keep in step with build.sh and tools/go.mod
out="$WEFT_CACHE/kube-$KUBE_VERSION"
[ -x "$out/e2e.test" ] && exit 0

echo "kube/e2e-build.sh: building e2e.test $KUBE_VERSION into $out"
minor="${KUBE_VERSION#v1.}"
minor="${minor%%.*}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
mkdir -p "$out"
cd "$here/tools"
start=$(date +%s)
CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 19 go test -c -ldflags "$ldflags" -o "$out/e2e.test.tmp" k8s.io/kubernetes/test/e2e
mv "$out/e2e.test.tmp" "$out/e2e.test"
echo "kube/e2e-build.sh: built in $(($(date +%s) - start)) s"
