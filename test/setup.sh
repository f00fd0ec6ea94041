#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine, skipping what is
# already there: Debian packages, and the reference CNI plugins built from the
# Go module proxy into a cache directory named by version.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=/dev/null
. test/versions.env
# shellcheck source=test/go.sh
. test/go.sh

need_pkgs=()
# The container runtimes of test/runtimes (Docker, Podman with its CNI
# backend, containerd with runc), busybox-static for the images they run,
# Debian's CNI plugins (portmap, loopback), systemd-analyze for dist/, a C
# compiler for flanneld (its udp backend is cgo), promtool (Debian's
# prometheus package; its service is not started, see policy-rc.d below)
# for the alerting rules in kube-manifests/alerts, chromium, the
# headless browser test/web opens `weftctl web`'s page in, and mmdebstrap,
# which makes the Debian roots of the e2e suite's images (test/cluster). clang, llvm
# (llvm-strip) and libbpf-dev compile uvxlan's fast path (backend/uvxlan/bpf):
# only to regenerate its committed objects, which a test compares with the
# source.
for p in iproute2 iputils-ping iperf3 ethtool tcpdump nftables conntrack \
	docker.io podman containerd runc busybox-static containernetworking-plugins iptables systemd \
	gcc libc6-dev prometheus chromium clang llvm libbpf-dev mmdebstrap; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
	echo "setup: installing ${need_pkgs[*]}"
	# The tests start every daemon themselves, inside their own namespaces:
	# a package must not start dockerd or containerd in the machine's root
	# namespace (dockerd would add docker0 there). policy-rc.d says no to
	# every service start during the install, unless the machine has its own.
	policy=/usr/sbin/policy-rc.d
	made_policy=
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
	fi
	status=0
	{ apt-get update -qq &&
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null; } ||
		status=$?
	if [ -n "$made_policy" ]; then
		rm -f "$policy"
	fi
	if [ "$status" != 0 ]; then
		echo "setup: installing ${need_pkgs[*]} failed" >&2
		exit "$status"
	fi
fi

cni_dir="$WEFT_CACHE/cni-plugins-$CNI_PLUGINS_VERSION"
if [ ! -x "$cni_dir/portmap" ] || [ ! -x "$cni_dir/bridge" ] || [ ! -x "$cni_dir/host-local" ] || [ ! -x "$cni_dir/loopback" ]; then
	echo "setup: building reference CNI plugins $CNI_PLUGINS_VERSION into $cni_dir"
	mkdir -p "$cni_dir"
	(cd / && GOBIN="$cni_dir" GOFLAGS=-mod=mod go install \
		"github.com/containernetworking/plugins/plugins/main/bridge@$CNI_PLUGINS_VERSION" \
		"github.com/containernetworking/plugins/plugins/ipam/host-local@$CNI_PLUGINS_VERSION" \
		"github.com/containernetworking/plugins/plugins/meta/portmap@$CNI_PLUGINS_VERSION" \
		"github.com/containernetworking/plugins/plugins/main/loopback@$CNI_PLUGINS_VERSION")
fi

# crictl for the CRI test of test/runtimes.
crictl_dir="$WEFT_CACHE/cri-tools-$CRICTL_VERSION"
if [ ! -x "$crictl_dir/crictl" ]; then
	echo "setup: building crictl $CRICTL_VERSION into $crictl_dir"
	mkdir -p "$crictl_dir"
	(cd / && GOBIN="$crictl_dir" GOFLAGS=-mod=mod go install "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION")
fi

# A real flanneld for the migration test (test/e2e) and Flannel's image
# (test/cluster/flannel-images.sh), built from the Go module proxy.
test/flanneld.sh >/dev/null

# The helm CLI for the chart tests of test/helm, built from the Go module
# proxy outside weft's module (Helm's Kubernetes libraries are not weft's).
helm_dir="$WEFT_CACHE/helm-$HELM_VERSION"
if [ ! -x "$helm_dir/helm" ]; then
	echo "setup: building helm $HELM_VERSION into $helm_dir"
	mkdir -p "$helm_dir"
	(cd / && GOBIN="$helm_dir" GOFLAGS=-mod=mod CGO_ENABLED=0 go install "helm.sh/helm/${HELM_VERSION%%.*}/cmd/helm@$HELM_VERSION")
fi

# The real Kubernetes control plane for the Kubernetes-mode tests, built once
# from source and cached by version (a cold build takes 10-20 min).
test/kube/build.sh

# For the real cluster of test/cluster: Kubernetes' e2e suite (e2e.test) and
# the images its specs and the cluster's DNS run, built offline, both cached
# by version (cold, on a loaded 2-core machine: e2e.test 15 min after the
# build above; the images 17 min, most of it CoreDNS's build).
test/kube/e2e-build.sh
test/cluster/images.sh >/dev/null
# The images Flannel's own manifest runs, for the Flannel columns of
# test/cluster/conformance.sh (`test/cluster/up.sh -cni flannel`): flanneld
# on a Debian root and the Flannel CNI plugin, offline, cached by version.
test/cluster/flannel-images.sh >/dev/null
