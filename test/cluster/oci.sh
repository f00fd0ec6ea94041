# Sourced by test/cluster/images.sh. oci_archive OUT ROOT CONFIG NAME...
# writes the directory ROOT as a one-layer image archive OUT named NAME...:
# an OCI image layout (index.json names each image with containerd's
# io.containerd.image.name annotation, which `ctr images import` uses as is)
# that also holds docker save's manifest.json, for `docker load`. CONFIG is
# the image config's "config" object (Entrypoint, Cmd, Env, User, ...).
# Device nodes and the contents of /dev, /proc and /sys are left out (the
# runtime mounts them).

# oci_blob FILE moves FILE into the layout's blobs as its digest and prints
# "DIGEST SIZE".
oci_blob() {
	local f=$1 dir=$2 dig size
	dig=$(sha256sum <"$f" | cut -d' ' -f1)
	size=$(stat -c %s "$f")
	mv "$f" "$dir/blobs/sha256/$dig"
	echo "$dig $size"
}

oci_archive() {
	local out=$1 root=$2 cfg=$3
	shift 3
	local w diffid layer cfgblob mfst n tag sep="" entries="" tags=""
	w=$(mktemp -d "$(dirname "$out")/oci.XXXXXX")
	mkdir -p "$w/blobs/sha256"
	tar --numeric-owner --sort=name --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
		-C "$root" -cf "$w/layer.tar" .
	diffid=$(sha256sum <"$w/layer.tar" | cut -d' ' -f1)
	gzip -n <"$w/layer.tar" >"$w/layer.tar.gz"
	rm "$w/layer.tar"
	read -r -a layer <<<"$(oci_blob "$w/layer.tar.gz" "$w")"
	printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"weft test/cluster/images.sh"}]}' \
		"$cfg" "$diffid" >"$w/config"
	read -r -a cfgblob <<<"$(oci_blob "$w/config" "$w")"
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
		"${cfgblob[0]}" "${cfgblob[1]}" "${layer[0]}" "${layer[1]}" >"$w/manifest"
	read -r -a mfst <<<"$(oci_blob "$w/manifest" "$w")"
	for n in "$@"; do
		tag=${n##*:}
		entries+=$(printf '%s{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}' \
			"$sep" "${mfst[0]}" "${mfst[1]}" "$n" "$tag")
		tags+=$(printf '%s"%s"' "$sep" "$n")
		sep=,
	done
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' "$entries" >"$w/index.json"
	printf '{"imageLayoutVersion":"1.0.0"}' >"$w/oci-layout"
	printf '[{"Config":"blobs/sha256/%s","RepoTags":[%s],"Layers":["blobs/sha256/%s"]}]' \
		"${cfgblob[0]}" "$tags" "${layer[0]}" >"$w/manifest.json"
	tar --numeric-owner --owner=0 --group=0 -C "$w" -cf "$out" oci-layout index.json manifest.json blobs
	rm -rf "$w"
}
