#!/usr/bin/env bash
# Checks the archives test/cluster/images.sh writes the way a node uses them:
# a private containerd (its own root, state and socket, in new network and
# mount namespaces; the CRI plugin off) imports each with
# `ctr -n k8s.io images import`, the image must then be listed under its
# upstream name, and runc runs in it the commands the e2e specs run there
# (dig, curl, nc, nginx, coredns, ...). Everything is removed on exit, the
# containers' cgroups too (they are under a parent of this run's own).
# Usage: test/cluster/images-check.sh [archive-dir]
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=/dev/null
. "$repo/test/versions.env"
dir="${1:-$WEFT_CACHE/images-v1.37.2}"
log() { echo "images-check.sh: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "needs root"; exit 1; }

if [ -z "${WEFT_IMAGES_CHECK_INNER:-}" ]; then
	# Re-run inside new network and mount namespaces: containerd's state
	# and the containers' network stay there.
	exec env WEFT_IMAGES_CHECK_INNER=1 unshare --net --mount --propagation private --fork "$0" "$dir"
fi

d="$(mktemp -d /tmp/weft-images-check.XXXXXX)"
mount -t tmpfs tmpfs "$d"
pid=""
cg="weft-images-check-$$"
cleanup() {
	set +e
	if [ -n "$pid" ]; then
		for c in $(ctr -a "$d/sock" -n k8s.io containers ls -q 2>/dev/null); do
			ctr -a "$d/sock" -n k8s.io tasks kill -s KILL "$c" 2>/dev/null
			ctr -a "$d/sock" -n k8s.io tasks delete "$c" 2>/dev/null
			ctr -a "$d/sock" -n k8s.io containers delete "$c" 2>/dev/null
		done
		kill "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	fi
	for c in /sys/fs/cgroup/*/"$cg"; do [ -d "$c" ] && rmdir "$c"; done
	grep -o " $d/[^ ]*" /proc/self/mounts | sort -r | while read -r m; do umount -l "$m"; done
	umount -l "$d"
	rmdir "$d"
}
trap cleanup EXIT
cat >"$d/config.toml" <<EOF
version = 2
root = "$d/root"
state = "$d/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$d/sock"
EOF
containerd --config "$d/config.toml" >"$d/containerd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
	ctr -a "$d/sock" version >/dev/null 2>&1 && break
	sleep 0.1
done
ctr="ctr -a $d/sock -n k8s.io"

fails=0
# check ARCHIVE IMAGE CMD... imports ARCHIVE and runs CMD in IMAGE.
check() {
	local a="$dir/$1.tar" img=$2 id="check-$RANDOM"
	shift 2
	[ -s "$a" ] || { log "FAIL: no archive $a"; fails=$((fails + 1)); return; }
	# (the list is read first: with pipefail, grep -q ending early would
	# make ctr's SIGPIPE fail the pipeline)
	local have
	have="$($ctr images ls -q)"
	if ! grep -qx "$img" <<<"$have"; then
		$ctr images import "$a" >/dev/null || { log "FAIL: ctr images import $a"; fails=$((fails + 1)); return; }
		have="$($ctr images ls -q)"
	fi
	grep -qx "$img" <<<"$have" || { log "FAIL: $img not listed after importing $a"; fails=$((fails + 1)); return; }
	if out=$($ctr run --rm --cgroup "/$cg/$id" "$img" "$id" "$@" 2>&1); then
		log "ok: $img: $* -> $(echo "$out" | head -1)"
	else
		log "FAIL: $img: $*: $out"
		fails=$((fails + 1))
	fi
}

check pause registry.k8s.io/pause:3.10.2 /pause -v
check busybox registry.k8s.io/e2e-test-images/busybox:1.37.0-2 sh -c 'id -u && wget --help 2>&1 | head -1 && nc --help 2>&1 | head -1'
check nginx registry.k8s.io/e2e-test-images/nginx:1.27.0-2 nginx -t
check nginx registry.k8s.io/e2e-test-images/nginx:1.28.0-2 nginx -v
check glibc-dns-testing registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1 sh -c 'dig -v && getent passwd root && /coredns -version'
check agnhost registry.k8s.io/e2e-test-images/agnhost:2.66.1 sh -c 'for c in dig nslookup curl wget nc ss ip iperf bash socat ipcs ping timeout hostname /coredns /agnhost-2; do command -v $c >/dev/null || { echo missing $c; exit 1; }; done; id user-defined-in-image; /agnhost --version'
check agnhost registry.k8s.io/e2e-test-images/agnhost:2.66.1 sh -c 'test "$(/agnhost --help | grep -c -E "^  (netexec|connect|serve-hostname|pause|porter|test-webserver|dns-suffix) ")" = 7 && echo 7 subcommands'
check coredns registry.k8s.io/coredns/coredns:v1.14.6 /coredns -version
$ctr images ls | awk '/registry.k8s.io/ {print $1, $4, $5}' >&2
[ "$fails" = 0 ] || { log "$fails failed"; exit 1; }
log "all ok"
