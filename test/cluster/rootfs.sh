# Sourced by test/cluster/images.sh and flannel-images.sh: the roots their
# images are made of. debroot needs root, mmdebstrap and a scratch
# directory $tmp; both expect a log function.
DEBIAN_SUITE=bookworm
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

# debroot DIR PACKAGES makes a Debian minbase root with PACKAGES (comma
# separated), without documentation, apt lists or caches.
debroot() {
	local dir=$1 pkgs=$2
	nice -n 10 mmdebstrap --quiet --variant=minbase --mode=root --include="$pkgs" \
		--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
		--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
		--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		"$DEBIAN_SUITE" "$dir" "$DEBIAN_MIRROR" >"$tmp/mmdebstrap.log" 2>&1 ||
		{ tail -30 "$tmp/mmdebstrap.log" >&2; log "mmdebstrap failed"; return 1; }
	rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/* "$dir"/var/log/*.log "$dir"/var/log/apt/*
	printf 'uninitialized\n' >"$dir/etc/machine-id"
}

# staticroot DIR makes the minimal files a static-binary image has.
staticroot() {
	mkdir -p "$1/etc" "$1/tmp"
	chmod 1777 "$1/tmp"
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n' >"$1/etc/passwd"
	printf 'root:x:0:\nnobody:x:65534:\n' >"$1/etc/group"
}
