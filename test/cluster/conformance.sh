#!/usr/bin/env bash
# The full run behind docs/conformance.md: for each cluster configuration
# below, brings up the real cluster (test/cluster/up.sh), runs Kubernetes'
# suites against it (test/cluster/e2e.sh), takes it down (test/cluster/down.sh,
# also on failure), and keeps its results in RESULTS/<configuration>/; once
# every configuration of the matrix has a complete run there, writes
# docs/conformance.md with test/cluster/e2ereport, which refuses an
# incomplete run.
#
#   weft vxlan and uvxlan (fast path, the default), kube-proxy iptables:
#       conformance (every [sig-network] ... [Conformance] spec) and netpol
#   the same with kube-proxy nftables: conformance
#   Flannel, kube-proxy iptables and nftables: conformance (Flannel has no
#       NetworkPolicy, so its Netpol column would measure nothing)
#
# Usage:
#   test/cluster/conformance.sh [RESULTS]          run the matrix, then report
#   test/cluster/conformance.sh -report [RESULTS]  only write the report
# RESULTS defaults to $WEFT_CONFORMANCE_DIR or /var/tmp/weft-conformance/current.
# WEFT_CONFORMANCE_ONLY=REGEX runs only the configurations whose label
# matches; each run replaces that configuration's results (only once its
# suites have finished) and keeps the others', so configurations can be run
# separately, even from different commits: each column of the report says
# its own commit, date, Kubernetes version and times, and the report says
# when they differ. Needs root. Measured on one configuration (weft vxlan,
# kube-proxy iptables, 3 nodes, 2 loaded cores): conformance 408 s, Netpol
# 444 s; the whole matrix should take a little over an hour.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=test/go.sh
. "$repo/test/go.sh"
log() { echo "conformance.sh: $*" >&2; }
report_only=""
if [ "${1:-}" = -report ]; then
	report_only=1
	shift
fi
out="${1:-${WEFT_CONFORMANCE_DIR:-/var/tmp/weft-conformance/current}}"

# label | test/cluster/up.sh arguments | selections
configs=(
	"weft vxlan, kube-proxy iptables|-backend vxlan -proxy-mode iptables|conformance netpol"
	"weft uvxlan, kube-proxy iptables|-backend uvxlan -proxy-mode iptables|conformance netpol"
	"weft vxlan, kube-proxy nftables|-backend vxlan -proxy-mode nftables|conformance"
	"weft uvxlan, kube-proxy nftables|-backend uvxlan -proxy-mode nftables|conformance"
	"Flannel, kube-proxy iptables|-cni flannel -proxy-mode iptables|conformance"
	"Flannel, kube-proxy nftables|-cni flannel -proxy-mode nftables|conformance"
)

slug() { tr -c 'a-z0-9\n' '-' <<<"${1,,}" | tr -s -; }

selected() { [ -z "${WEFT_CONFORMANCE_ONLY:-}" ] || [[ "$1" =~ $WEFT_CONFORMANCE_ONLY ]]; }

# run_config LABEL ARGS SELS runs one configuration into $out/.running-SLUG
# and, once its suites have finished, makes that $out/SLUG.
run_config() {
	local label=$1 args=$2 sels=$3 s d kubeconfig t0 up_s
	s="$(slug "$label")"
	d="$out/.running-$s"
	rm -rf "$d"
	log "$label: up $args"
	t0=$(date +%s)
	up=1
	# shellcheck disable=SC2086 # args are words
	if ! kubeconfig="$("$repo/test/cluster/up.sh" $args | tail -1)" || [ -z "$kubeconfig" ]; then
		log "$label: the cluster did not come up; its previous results are kept"
		"$repo/test/cluster/down.sh" >&2 || log "down.sh failed"
		up=""
		return 1
	fi
	up_s=$(($(date +%s) - t0))
	log "$label: cluster up in $up_s s ($kubeconfig)"
	# shellcheck disable=SC2086 # sels are words
	"$repo/test/cluster/e2e.sh" -o "$d" -l "$label" "$kubeconfig" $sels >/dev/null || true
	"$repo/test/cluster/down.sh" >&2
	up=""
	for sel in $sels; do
		if [ ! -f "$d/$sel/meta.txt" ]; then
			log "$label: $sel wrote no results; the previous ones are kept"
			return 1
		fi
		printf 'up_args=%s\nup_seconds=%s\n' "$args" "$up_s" >>"$d/$sel/meta.txt"
	done
	rm -rf "${out:?}/$s"
	mv "$d" "$out/$s"
}

mkdir -p "$out"
up=""
cleanup() {
	if [ -n "$up" ]; then
		"$repo/test/cluster/down.sh" >&2 || log "down.sh failed"
	fi
}
trap cleanup EXIT
if [ -z "$report_only" ]; then
	# Every up.sh flag the selected configurations use must exist before
	# hours are spent.
	help="$(cd "$repo" && go run ./test/cluster up -h 2>&1 || true)"
	for c in "${configs[@]}"; do
		IFS='|' read -r label args _ <<<"$c"
		selected "$label" || continue
		for f in $args; do
			[[ "$f" == -* ]] || continue
			grep -q -- "^ *${f%%=*} " <<<"$help" || { log "$label: test/cluster/up.sh has no $f flag"; exit 1; }
		done
	done
	start=$(date +%s)
	failed=0
	for c in "${configs[@]}"; do
		IFS='|' read -r label args sels <<<"$c"
		selected "$label" || continue
		run_config "$label" "$args" "$sels" || failed=1
	done
	log "runs done in $(($(date +%s) - start)) s; results in $out"
fi

# The plan: every configuration of the matrix, whether run now or before.
plan="$out/plan"
: >"$plan.tmp"
missing=()
for c in "${configs[@]}"; do
	IFS='|' read -r label _ sels <<<"$c"
	for sel in $sels; do
		[ -f "$out/$(slug "$label")/$sel/meta.txt" ] || missing+=("$label: $sel")
		printf '%s\t%s\n' "$label" "$(slug "$label")/$sel" >>"$plan.tmp"
	done
done
mv "$plan.tmp" "$plan"
if [ ${#missing[@]} -gt 0 ]; then
	log "no results yet in $out for:"
	printf '  %s\n' "${missing[@]}" >&2
	log "docs/conformance.md left unchanged"
	exit "${failed:-0}"
fi
(cd "$repo" && go run ./test/cluster/e2ereport markdown -o docs/conformance.md "$plan")
log "wrote docs/conformance.md from $out"
exit "${failed:-0}"
