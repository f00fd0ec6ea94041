#!/usr/bin/env bash
# Builds weft's image from the repository's Dockerfile with a private dockerd
# and checks it: weftd --version runs, the CNI plugin answers VERSION, the
# init containers' atomic install works, and the image holds only the
# binaries (no Go toolchain).
#
# No registry is reachable here, so the base images the Dockerfile names by
# ARG are made locally: the builder from this machine's Go (GOROOT) plus a
# static busybox for RUN, the busybox stage from busybox-static. Modules are
# vendored into a copy of the build context, so the build needs no network.
#
# dockerd runs with its own data/exec roots and socket, touches no network
# state (no bridge, iptables, masquerade or ip_forward), and is stopped by
# PID with its state removed on exit. With WEFT_IMAGE_SAVE=<file> the
# checked image is also written there (docker save), named WEFT_IMAGE_NAME
# (default ghcr.io/weft-net/weft:<version>), for a cluster's nodes to
# import (test/cluster). Exit status 77: docker.io cannot be
# installed (the Go test then fails, or skips when WEFT_TEST_SKIP names
# tools; under CI=true it always fails).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=/dev/null
. "$repo/test/versions.env"
log() { echo "image/build.sh: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
	log "needs root (dockerd)"
	exit 77
fi
need=()
[ -x /usr/sbin/dockerd ] && [ -x /usr/bin/docker ] || need+=(docker.io)
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx sh || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }; then
		log "cannot install ${need[*]}"
		exit 77
	fi
fi
docker=/usr/bin/docker # the engine's own client, whatever else is on PATH

d="$(mktemp -d /tmp/weft-image.XXXXXX)"
dockerd_pid=""
cleanup() {
	set +e
	if [ -n "$dockerd_pid" ] && kill -0 "$dockerd_pid" 2>/dev/null; then
		kill -TERM "$dockerd_pid" 2>/dev/null || true
		for _ in $(seq 1 100); do
			kill -0 "$dockerd_pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$dockerd_pid" 2>/dev/null || true
	fi
	# dockerd may leave its overlay mounts behind if it was killed
	grep -o " $d/[^ ]*" /proc/self/mounts | sort -r | while read -r m; do umount -l "$m"; done
	rm -rf "$d" || log "cannot remove $d"
}
trap cleanup EXIT

start=$(date +%s)
/usr/sbin/dockerd --data-root "$d/root" --exec-root "$d/exec" --pidfile "$d/dockerd.pid" \
	-H "unix://$d/docker.sock" --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
	--ip-forward=false >"$d/dockerd.log" 2>&1 &
dockerd_pid=$!
export DOCKER_HOST="unix://$d/docker.sock"
for _ in $(seq 1 300); do
	"$docker" version >/dev/null 2>&1 && break
	if ! kill -0 "$dockerd_pid" 2>/dev/null; then
		log "dockerd exited:"; tail -20 "$d/dockerd.log" >&2; exit 1
	fi
	sleep 0.1
done
"$docker" version >/dev/null || { log "dockerd not up:"; tail -20 "$d/dockerd.log" >&2; exit 1; }

# The build context: the working tree as .dockerignore would send it, with
# the modules vendored.
mkdir -p "$d/ctx"
tar -C "$repo" --exclude=./.git --exclude=./test/kube/tools -c . | tar -C "$d/ctx" -x
(cd "$d/ctx" && GOFLAGS=-mod=mod go mod vendor)
pkgs="./cmd/weftd ./cmd/weft"
if ls "$d/ctx"/cmd/weftctl/*.go >/dev/null 2>&1; then pkgs="$pkgs ./cmd/weftctl"; fi

# Warm a Go build cache kept for this purpose under $WEFT_CACHE by building
# the same packages with the Dockerfile's flags on this machine, and give it
# to the local builder image: on a warm machine the image build then only
# links. (A user's golang image starts cold; the Dockerfile is the same.)
version="test-$(date +%s)"
gocache="$WEFT_CACHE/image-gocache"
mkdir -p "$gocache" "$d/warm"
# Builds at once (test/image's and test/cluster's run in parallel) share
# the cache: one must not pack it while another writes to it.
exec {cachelock}>"$gocache.lock"
flock "$cachelock"
wstart=$(date +%s)
# shellcheck disable=SC2086
(cd "$d/ctx" && CGO_ENABLED=0 GOCACHE="$gocache" GOFLAGS= go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$d/warm/" $pkgs)
log "Go build cache warmed in $(($(date +%s) - wstart)) s"

# Local stand-ins for the Dockerfile's base images.
goroot="$(go env GOROOT)"
mkdir -p "$d/busybox/bin" "$d/busybox/tmp"
cp /bin/busybox "$d/busybox/bin/busybox"
tar -C "$d/busybox" -c . | "$docker" import - weft-local/busybox:static >/dev/null
mkdir -p "$d/golang/bin" "$d/golang/tmp" "$d/golang/usr/local"
cp /bin/busybox "$d/golang/bin/busybox"
for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$d/golang/bin/$a"; done
tar -C "$d/golang" -cf "$d/golang.tar" .
tar -C "$(dirname "$goroot")" -rf "$d/golang.tar" --transform "s|^$(basename "$goroot")|usr/local/go|" "$(basename "$goroot")"
tar -C "$gocache" -rf "$d/golang.tar" --transform "s|^\.|root/.cache/go-build|" .
flock -u "$cachelock"
"$docker" import \
	--change 'ENV PATH=/usr/local/go/bin:/bin' --change 'ENV GOTOOLCHAIN=local' --change 'ENV HOME=/root' \
	"$d/golang.tar" weft-local/golang:local >/dev/null
rm -f "$d/golang.tar"

log "daemon and base images ready in $(($(date +%s) - start)) s; building the image"

img="weft-local/weft:$version"
bstart=$(date +%s)
DOCKER_BUILDKIT=1 "$docker" build --network=none -q \
	--build-arg GO_IMAGE=weft-local/golang:local \
	--build-arg BUSYBOX_IMAGE=weft-local/busybox:static \
	--build-arg VERSION="$version" \
	-t "$img" -f "$repo/Dockerfile" "$d/ctx" >/dev/null
log "image built in $(($(date +%s) - bstart)) s"

fail() { log "FAIL: $*"; exit 1; }

# `docker run <image> weftd --version` prints the version.
out="$("$docker" run --rm --network=none "$img" weftd --version)"
[ "$out" = "weftd $version" ] || fail "weftd --version printed '$out', want 'weftd $version'"

# The CNI plugin answers VERSION.
out="$(echo '{"cniVersion":"1.1.0"}' | "$docker" run --rm -i --network=none -e CNI_COMMAND=VERSION --entrypoint /usr/local/bin/weft "$img")"
echo "$out" | grep -q '"supportedVersions"' || fail "weft VERSION printed '$out'"
echo "$out" | grep -q '"1.1.0"' || fail "weft does not support CNI 1.1.0: '$out'"

# The install-cni-plugin init container's command (kube-manifests) works.
mkdir -p "$d/cnibin"
install_cmd="$(sed -n '/name: install-cni-plugin/,/volumeMounts/p' "$repo/kube-manifests/kube-weft.yml" |
	sed -n '/args:/,/volumeMounts/p' | sed '1d;$d' | sed 's/^ *- //; s/^ *//' | tr '\n' ' ')"
[ -n "$install_cmd" ] || fail "no install command found in kube-manifests/kube-weft.yml"
"$docker" run --rm --network=none -v "$d/cnibin:/opt/cni/bin" --entrypoint /bin/busybox "$img" sh -c "$install_cmd"
[ -x "$d/cnibin/weft" ] || fail "the install command left no executable /opt/cni/bin/weft"
ls -A "$d/cnibin" | grep -qv '^weft$' && fail "the install command left temporary files: $(ls -A "$d/cnibin")"

# Flannel's paths: Flannel's manifest runs /opt/bin/flanneld (weftd, as
# flanneld), `cp -f /flannel /opt/cni/bin/flannel` and /opt/bin/install-conf.
out="$("$docker" run --rm --network=none --entrypoint /opt/bin/flanneld "$img" --version)"
[ "$out" = "weftd $version" ] || fail "/opt/bin/flanneld --version printed '$out'"
mkdir -p "$d/flcni" "$d/flconf"
"$docker" run --rm --network=none -v "$d/flcni:/opt/cni/bin" --entrypoint cp "$img" -f /flannel /opt/cni/bin/flannel
[ -x "$d/flcni/flannel" ] || fail "cp -f /flannel /opt/cni/bin/flannel left no executable"
echo '{"name":"cbr0"}' >"$d/flconf/cni-conf.json"
"$docker" run --rm --network=none -v "$d/flconf:/etc/kube-flannel" -v "$d/flcni:/etc/cni/net.d" \
	--entrypoint /opt/bin/install-conf "$img" /etc/kube-flannel/cni-conf.json /etc/cni/net.d/10-flannel.conflist
cmp -s "$d/flconf/cni-conf.json" "$d/flcni/10-flannel.conflist" || fail "install-conf did not install the conflist"

# The image holds only the binaries: no Go toolchain, nothing else.
cid="$("$docker" create "$img")"
"$docker" export "$cid" >"$d/fs.tar"
"$docker" rm "$cid" >/dev/null
files="$(tar -tf "$d/fs.tar" | grep -v '/$' | grep -vE '^(\.dockerenv|etc/(hosts|hostname|resolv\.conf|mtab)|dev/.*|proc/.*|sys/.*)$' | LC_ALL=C sort | tr '\n' ' ')"
case "$files" in
"bin/busybox bin/cp flannel opt/bin/flanneld opt/bin/install-conf usr/local/bin/weft usr/local/bin/weftd " | \
	"bin/busybox bin/cp flannel opt/bin/flanneld opt/bin/install-conf usr/local/bin/weft usr/local/bin/weftctl usr/local/bin/weftd ") ;;
*) fail "unexpected files in the image: $files" ;;
esac
tar -tf "$d/fs.tar" | grep -qE '(^|/)go(/|$)|/go/bin' && fail "the image contains a Go toolchain"
mkdir -p "$d/fs" && tar -C "$d/fs" -xf "$d/fs.tar" usr/local/bin/weft
cmp -s "$d/fs/usr/local/bin/weft" "$d/cnibin/weft" || fail "installed plugin differs from the image's"

# Default command and OCI labels.
ep="$("$docker" image inspect -f '{{json .Config.Entrypoint}} {{json .Config.Cmd}}' "$img")"
[ "$ep" = 'null ["weftd"]' ] || fail "entrypoint and command $ep, want none and weftd"
lv="$("$docker" image inspect -f '{{index .Config.Labels "org.opencontainers.image.version"}}' "$img")"
[ "$lv" = "$version" ] || fail "label org.opencontainers.image.version=$lv, want $version"
size="$("$docker" image inspect -f '{{.Size}}' "$img")"
[ "$size" -lt $((150 * 1024 * 1024)) ] || fail "image is $size bytes"
log "ok: $img, $((size / 1024 / 1024)) MiB, files: $files, total $(($(date +%s) - start)) s"
if [ -n "${WEFT_IMAGE_SAVE:-}" ]; then
	name="${WEFT_IMAGE_NAME:-ghcr.io/weft-net/weft:$version}"
	"$docker" tag "$img" "$name"
	"$docker" save -o "$WEFT_IMAGE_SAVE" "$name"
	log "saved $name to $WEFT_IMAGE_SAVE"
fi
