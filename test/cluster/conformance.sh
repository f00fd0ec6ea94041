#!/usr/bin/env bash
# The full run behind docs/conformance.md: for each cluster configuration
# below, brings up the real cluster (test/cluster/up.sh), runs Kubernetes'
# suites against it (test/cluster/e2e.sh), takes it down (test/cluster/down.sh,
# also on failure), and at the end writes docs/conformance.md with
# test/cluster/e2ereport, which refuses unless every run is complete.
#
#   weft vxlan and uvxlan (fast path, the default), kube-proxy iptables:
#       conformance (every [sig-network] ... [Conformance] spec) and netpol
#   the same with kube-proxy nftables: conformance
#   Flannel, kube-proxy iptables and nftables: conformance (Flannel has no
#       NetworkPolicy, so its Netpol column would measure nothing)
#
# Usage: test/cluster/conformance.sh [OUTDIR]   (default /var/tmp/weft-conformance/<date>)
# WEFT_CONFORMANCE_ONLY=REGEX runs only the configurations whose label
# matches (docs/conformance.md is then not written). Needs root. Measured on
# one configuration (weft vxlan, kube-proxy iptables, 3 nodes, 2 loaded
# cores): conformance 408 s, Netpol 444 s; the whole matrix should take a
# little over an hour.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=test/go.sh
. "$repo/test/go.sh"
out="${1:-/var/tmp/weft-conformance/$(date -u +%Y%m%dT%H%M%SZ)}"
log() { echo "conformance.sh: $*" >&2; }

# label | test/cluster/up.sh arguments | selections
configs=(
	"weft vxlan, kube-proxy iptables|-backend vxlan -proxy-mode iptables|conformance netpol"
	"weft uvxlan, kube-proxy iptables|-backend uvxlan -proxy-mode iptables|conformance netpol"
	"weft vxlan, kube-proxy nftables|-backend vxlan -proxy-mode nftables|conformance"
	"weft uvxlan, kube-proxy nftables|-backend uvxlan -proxy-mode nftables|conformance"
	"Flannel, kube-proxy iptables|-cni flannel -proxy-mode iptables|conformance"
	"Flannel, kube-proxy nftables|-cni flannel -proxy-mode nftables|conformance"
)

# Every up.sh flag used above must exist before hours are spent.
help="$(cd "$repo" && go run ./test/cluster up -h 2>&1 || true)"
for f in backend cni proxy-mode; do
	grep -q -- "-$f" <<<"$help" || { log "test/cluster/up.sh has no -$f flag"; exit 1; }
done

mkdir -p "$out"
plan="$out/plan"
: >"$plan"
up=""
cleanup() {
	if [ -n "$up" ]; then
		"$repo/test/cluster/down.sh" >&2 || log "down.sh failed"
	fi
}
trap cleanup EXIT
all=1
start=$(date +%s)
for c in "${configs[@]}"; do
	IFS='|' read -r label args sels <<<"$c"
	if [ -n "${WEFT_CONFORMANCE_ONLY:-}" ] && ! [[ "$label" =~ $WEFT_CONFORMANCE_ONLY ]]; then
		all=""
		continue
	fi
	slug="$(tr -c 'a-z0-9\n' '-' <<<"${label,,}" | tr -s -)"
	log "$label: up $args"
	t0=$(date +%s)
	up=1
	# shellcheck disable=SC2086 # args are words
	kubeconfig="$("$repo/test/cluster/up.sh" $args | tail -1)"
	log "$label: cluster up in $(($(date +%s) - t0)) s ($kubeconfig)"
	# shellcheck disable=SC2086 # sels are words
	"$repo/test/cluster/e2e.sh" -o "$out/$slug" -l "$label" "$kubeconfig" $sels >/dev/null || true
	"$repo/test/cluster/down.sh" >&2
	up=""
	for s in $sels; do
		printf '%s\t%s\n' "$label" "$slug/$s" >>"$plan"
	done
done
log "all runs in $(($(date +%s) - start)) s; reports in $out"
if [ -z "$all" ]; then
	log "only some configurations ran: docs/conformance.md left unchanged"
	exit 0
fi
(cd "$repo" && go run ./test/cluster/e2ereport markdown -o docs/conformance.md "$plan")
log "wrote docs/conformance.md"
