#!/usr/bin/env bash
# Builds, without any registry, the two images Flannel's own manifest
# (Documentation/kube-flannel.yml of github.com/flannel-io/flannel at
# FLANNEL_VERSION) runs, for `test/cluster/up.sh -cni flannel`:
#
#   ghcr.io/flannel-io/flannel:$FLANNEL_VERSION-local
#       what Flannel's images/Dockerfile puts in its image, on a Debian root
#       instead of Alpine: /opt/bin/flanneld (test/flanneld.sh),
#       /opt/bin/install-conf (its cmd/install_conf), /opt/bin/mk-docker-opts.sh,
#       and the tools flanneld runs: iproute2, iptables (Debian's default,
#       the nft backend, which is also what kube-proxy uses on these nodes;
#       Flannel's image picks legacy or nft at start with kubernetes-sigs'
#       iptables-wrapper, which the Go module proxy does not serve), nftables,
#       wireguard-tools, ca-certificates. No strongswan (the ipsec backend is
#       not used here).
#   ghcr.io/flannel-io/flannel-cni-plugin:cni-plugins-v0.9.1-local
#       /flannel (the CNI plugin the manifest's init container copies into
#       /opt/cni/bin) and a static busybox for its `cp`. Flannel's plugin
#       module, github.com/flannel-io/cni-plugin, is not served by the Go
#       module proxy, so /flannel is built from the last release that
#       carried Flannel's plugin, containernetworking/plugins v0.9.1
#       (plugins/meta/flannel, the code flannel-io/cni-plugin continued
#       from). It predates CNI 1.0: the cluster's conflist names
#       cniVersion 0.4.0.
#
# Each is one layer written as an OCI archive (test/cluster/oci.sh) into
# $WEFT_CACHE/flannel-images-$FLANNEL_VERSION/; an archive already there is
# never rebuilt. Prints "IMAGE ARCHIVE" lines. Nothing fetched is kept in
# the repository. Needs root (mmdebstrap).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=/dev/null
. "$repo/test/versions.env"
# shellcheck source=test/go.sh
. "$repo/test/go.sh"
PLUGINS_VERSION=v0.9.1 # containernetworking/plugins: the last with plugins/meta/flannel
out="$WEFT_CACHE/flannel-images-$FLANNEL_VERSION"
log() { echo "flannel-images.sh: $*" >&2; }

flannel_ref="ghcr.io/flannel-io/flannel:$FLANNEL_VERSION-local"
plugin_ref="ghcr.io/flannel-io/flannel-cni-plugin:cni-plugins-$PLUGINS_VERSION-local"
print() {
	echo "$flannel_ref $out/flannel.tar"
	echo "$plugin_ref $out/flannel-cni-plugin.tar"
}
if [ -s "$out/flannel.tar" ] && [ -s "$out/flannel-cni-plugin.tar" ]; then
	print
	exit 0
fi
[ "$(id -u)" = 0 ] || { log "needs root (mmdebstrap)"; exit 1; }
command -v mmdebstrap >/dev/null || { log "needs mmdebstrap: apt-get install mmdebstrap"; exit 1; }
[ -x /bin/busybox ] || { log "needs /bin/busybox: apt-get install busybox-static"; exit 1; }

mkdir -p "$out"
tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=test/cluster/rootfs.sh
. "$repo/test/cluster/rootfs.sh"
# shellcheck source=test/cluster/oci.sh
. "$repo/test/cluster/oci.sh"

modsrc() {
	(cd / && GOFLAGS=-mod=mod go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
}

build_flannel() {
	local r="$tmp/flannel" src flanneld
	flanneld="$("$repo/test/flanneld.sh")"
	src="$(modsrc "github.com/flannel-io/flannel@$FLANNEL_VERSION")"
	cp -r "$src/." "$tmp/src/"
	chmod -R u+w "$tmp/src"
	debroot "$r" iproute2,iptables,nftables,wireguard-tools,ca-certificates
	mkdir -p "$r/opt/bin"
	(cd "$tmp/src" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n 19 go build -trimpath -ldflags "-s -w" \
		-o "$r/opt/bin/install-conf" ./cmd/install_conf)
	cp "$flanneld" "$r/opt/bin/flanneld"
	cp "$src/dist/mk-docker-opts.sh" "$r/opt/bin/"
	chmod 755 "$r/opt/bin/"*
	oci_archive "$1" "$r" '{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":["/opt/bin/flanneld"]}' "$flannel_ref"
}

build_flannel-cni-plugin() {
	local r="$tmp/plugin" a
	staticroot "$r"
	mkdir -p "$r/bin"
	cp /bin/busybox "$r/bin/busybox"
	for a in sh cp ls cat; do ln -s busybox "$r/bin/$a"; done
	(cd / && CGO_ENABLED=0 GOFLAGS=-mod=mod GOBIN="$tmp/gobin" nice -n 19 go install -trimpath -ldflags "-s -w" \
		"github.com/containernetworking/plugins/plugins/meta/flannel@$PLUGINS_VERSION")
	cp "$tmp/gobin/flannel" "$r/flannel"
	oci_archive "$1" "$r" '{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["/bin/sh"]}' "$plugin_ref"
}

mkdir -p "$tmp/src"
for i in flannel flannel-cni-plugin; do
	[ -s "$out/$i.tar" ] && continue
	start=$(date +%s)
	"build_$i" "$tmp/$i.tar"
	mv "$tmp/$i.tar" "$out/$i.tar"
	log "$i: $(du -h "$out/$i.tar" | cut -f1) in $(($(date +%s) - start)) s"
done
print
