#!/usr/bin/env bash
# Builds, without any registry, the container images that Kubernetes' e2e
# suite at KUBE_VERSION runs in the specs test/cluster/e2e.sh selects, plus
# CoreDNS for the cluster's DNS, under the names the suite uses
# (k8s.io/kubernetes test/utils/image/manifest.go), so that no pod ever pulls:
#
#   registry.k8s.io/e2e-test-images/agnhost:2.66.1          Debian root + agnhost + coredns
#   registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1  Debian root + dig + coredns
#   registry.k8s.io/e2e-test-images/nginx:1.27.0-2 (and 1.28.0-2)  Debian's nginx
#   registry.k8s.io/e2e-test-images/busybox:1.37.0-2          Debian's busybox-static
#   registry.k8s.io/pause:3.10.2                              pause.c, static
#   registry.k8s.io/coredns/coredns:v1.14.6                   CoreDNS, static
#
# and, only when named, for bench/cluster (in bench/, so that test/cluster's
# bring-up, which imports every archive of the directory, leaves it out):
#
#   weft.test/bench/iperf3:bookworm                           Debian's iperf3
#
# Debian roots come from `mmdebstrap --variant=minbase` (bookworm, as the
# upstream glibc-dns-testing image); agnhost, CoreDNS and pause are built from
# their sources (Go module proxy, CGO_ENABLED=0; pause.c with gcc -static).
# Upstream agnhost is Alpine, so its dig is musl's; here both DNS probers of
# the DNS specs are glibc. Each image is one layer written as an OCI archive
# (with a docker-save manifest.json too) that `ctr -n k8s.io images import`
# and `docker load` take: $WEFT_CACHE/images-$KUBE_VERSION/<name>.tar. An
# archive already there is never rebuilt. Nothing fetched is kept in the
# repository.
#
# Usage: test/cluster/images.sh [image...]   (default: all; names as below)
# Prints the archives' paths, one a line. Needs root (mmdebstrap, chroot).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=/dev/null
. "$repo/test/versions.env"
# shellcheck source=test/go.sh
. "$repo/test/go.sh"
KUBE_VERSION=v1.37.2     # keep in step with test/kube/build.sh and test/kube/tools/go.mod
COREDNS_VERSION=v1.14.6  # kubeadm's CoreDNSVersion at KUBE_VERSION
out="$WEFT_CACHE/images-$KUBE_VERSION"
log() { echo "images.sh: $*" >&2; }

all=(pause busybox nginx glibc-dns-testing agnhost coredns)
extra=(iperf3)
archive() {
	case "$1" in
	iperf3) echo "$out/bench/$1.tar" ;;
	*) echo "$out/$1.tar" ;;
	esac
}

want=("$@")
[ ${#want[@]} -gt 0 ] || want=("${all[@]}")
todo=()
for i in "${want[@]}"; do
	case " ${all[*]} ${extra[*]} " in *" $i "*) ;; *) log "unknown image $i (known: ${all[*]} ${extra[*]})"; exit 2 ;; esac
	[ -s "$(archive "$i")" ] || todo+=("$i")
done
if [ ${#todo[@]} = 0 ]; then
	for i in "${want[@]}"; do archive "$i"; done
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	log "needs root (mmdebstrap, chroot)"
	exit 1
fi
for t in mmdebstrap gcc; do
	command -v "$t" >/dev/null || { log "needs $t: apt-get install $t"; exit 1; }
done
[ -x /bin/busybox ] || { log "needs /bin/busybox: apt-get install busybox-static"; exit 1; }

mkdir -p "$out/bin" "$out/bench"
tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# kube_src prints the directory of k8s.io/kubernetes@KUBE_VERSION in the
# module cache (pause.c, agnhost's porter certificates).
kube_src() {
	(cd "$repo/test/kube/tools" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
}

# gobin NAME builds a static binary once into $out/bin.
gobin() {
	local b="$out/bin/$1"
	if [ ! -x "$b" ]; then
		local start
		start=$(date +%s)
		case "$1" in
		agnhost)
			(cd "$repo/test/kube/tools" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 19 go build \
				-ldflags "-s -w -X main.Version=2.66.1" -o "$b.tmp" k8s.io/kubernetes/test/images/agnhost) ;;
		coredns)
			(cd / && CGO_ENABLED=0 GOFLAGS=-mod=mod GOBIN="$tmp/gobin" nice -n 19 go install \
				-ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION") && mv "$tmp/gobin/coredns" "$b.tmp" ;;
		pause)
			gcc -Os -Wall -Werror -static -DVERSION="v3.10.2-weft" -o "$b.tmp" "$(kube_src)/build/pause/linux/pause.c" &&
				strip "$b.tmp" ;;
		esac
		mv "$b.tmp" "$b"
		log "built $1 in $(($(date +%s) - start)) s"
	fi
	echo "$b"
}

# shellcheck source=test/cluster/rootfs.sh
. "$repo/test/cluster/rootfs.sh"

# shellcheck source=test/cluster/oci.sh
. "$repo/test/cluster/oci.sh"

build_pause() {
	local r="$tmp/pause"
	mkdir -p "$r"
	cp "$(gobin pause)" "$r/pause"
	oci_archive "$1" "$r" '{"User":"65535:65535","Entrypoint":["/pause"]}' registry.k8s.io/pause:3.10.2
}

build_busybox() {
	local r="$tmp/busybox" a
	staticroot "$r"
	mkdir -p "$r/bin" "$r/root" "$r/home" "$r/var/spool/mail" "$r/var/www"
	cp /bin/busybox "$r/bin/busybox"
	for a in $(/bin/busybox --list); do
		[ "$a" = busybox ] || ln -s busybox "$r/bin/$a"
	done
	oci_archive "$1" "$r" '{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["sh"]}' \
		registry.k8s.io/e2e-test-images/busybox:1.37.0-2
}

build_nginx() {
	local r="$tmp/nginx"
	debroot "$r" nginx
	# as the upstream image: the logs go to the container's output
	ln -sf /dev/stdout "$r/var/log/nginx/access.log"
	ln -sf /dev/stderr "$r/var/log/nginx/error.log"
	oci_archive "$1" "$r" '{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["nginx","-g","daemon off;"],"ExposedPorts":{"80/tcp":{}},"StopSignal":"SIGQUIT"}' \
		registry.k8s.io/e2e-test-images/nginx:1.27.0-2 registry.k8s.io/e2e-test-images/nginx:1.28.0-2
}

build_glibc-dns-testing() {
	local r="$tmp/glibc"
	debroot "$r" bind9-dnsutils
	cp "$(gobin coredns)" "$r/coredns"
	oci_archive "$1" "$r" '{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["bash"]}' \
		registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1
}

# agnhost as its upstream Dockerfile makes it, on Debian: the tools the specs
# run in it (dig and nslookup, curl, nc, ss and ip, iperf, bash, socat,
# ipcs), /coredns, /uploads, porter's certificates, agnhost-2, the user and
# group a SupplementalGroups spec expects; and, for the network tools
# Alpine's busybox has and these packages leave out (netstat, route,
# traceroute, arping, ...), busybox applets.
build_agnhost() {
	local r="$tmp/agnhost" src a
	debroot "$r" bind9-dnsutils,curl,wget,netcat-openbsd,iproute2,iputils-ping,iperf,socat,procps,util-linux,ca-certificates,busybox-static
	chroot "$r" groupadd -g 50000 group-defined-in-image
	chroot "$r" useradd -m -u 1000 -G group-defined-in-image user-defined-in-image
	for a in arp arping ifconfig netstat route traceroute traceroute6 telnet httpd ipcalc hexdump xxd less vi unzip strings killall time; do
		[ -e "$r/usr/bin/$a" ] || [ -L "$r/usr/bin/$a" ] || [ -e "$r/usr/sbin/$a" ] || [ -L "$r/usr/sbin/$a" ] ||
			ln -s /usr/bin/busybox "$r/usr/local/bin/$a"
	done
	cp "$(gobin agnhost)" "$r/agnhost"
	ln -s agnhost "$r/agnhost-2"
	cp "$(gobin coredns)" "$r/coredns"
	mkdir -p "$r/uploads"
	src="$(kube_src)"
	cp "$src/test/images/agnhost/porter/localhost.crt" "$src/test/images/agnhost/porter/localhost.key" "$r/"
	chmod 644 "$r/localhost.crt" "$r/localhost.key"
	oci_archive "$1" "$r" '{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":["/agnhost"],"Cmd":["pause"],"ExposedPorts":{"80/tcp":{},"8080/tcp":{},"8081/tcp":{},"9376/tcp":{},"5000/tcp":{}}}' \
		registry.k8s.io/e2e-test-images/agnhost:2.66.1
}

build_coredns() {
	local r="$tmp/coredns"
	staticroot "$r"
	mkdir -p "$r/etc/ssl/certs"
	cp /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/"
	cp "$(gobin coredns)" "$r/coredns"
	oci_archive "$1" "$r" '{"Entrypoint":["/coredns"],"ExposedPorts":{"53/tcp":{},"53/udp":{}}}' \
		"registry.k8s.io/coredns/coredns:$COREDNS_VERSION"
}

# iperf3 alone (the bench's other tool, its request/response client and
# server, is built by the bench from its own source).
build_iperf3() {
	local r="$tmp/iperf3"
	debroot "$r" iperf3
	oci_archive "$1" "$r" '{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":["iperf3"],"Cmd":["-s"],"ExposedPorts":{"5201/tcp":{},"5201/udp":{}}}' \
		weft.test/bench/iperf3:bookworm
}

for i in "${todo[@]}"; do
	start=$(date +%s)
	"build_$i" "$tmp/$i.tar"
	mv "$tmp/$i.tar" "$(archive "$i")"
	rm -rf "${tmp:?}"/*/
	log "$i: $(du -h "$(archive "$i")" | cut -f1) in $(($(date +%s) - start)) s"
done
for i in "${want[@]}"; do archive "$i"; done
