# weft's image: weftd (the node daemon, the entrypoint) and weft (the CNI
# plugin, copied onto the host by the DaemonSet's init containers), built as
# static binaries and shipped on an empty base with a static busybox, which
# the init containers use to copy files atomically (cp + mv).
#
#   docker build -t ghcr.io/weft-net/weft:latest --build-arg VERSION=$(git describe --always) .
#
# GO_IMAGE and BUSYBOX_IMAGE may name local images (test/image/build.sh does,
# on machines that cannot pull). A vendor/ directory in the context, if any,
# is used instead of downloading modules.
ARG GO_IMAGE=golang:1.26-bookworm
ARG BUSYBOX_IMAGE=busybox:1.37-musl

FROM ${GO_IMAGE} AS build
ARG VERSION=dev
WORKDIR /src
COPY . .
RUN set -e; \
    pkgs="./cmd/weftd ./cmd/weft"; \
    if ls cmd/weftctl/*.go >/dev/null 2>&1; then pkgs="$pkgs ./cmd/weftctl"; fi; \
    mkdir -p /out /fs/opt/bin /fs/bin; \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/ $pkgs; \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /fs/opt/bin/install-conf ./cmd/install-conf; \
    ln -s /usr/local/bin/weftd /fs/opt/bin/flanneld; \
    ln -s /usr/local/bin/weft /fs/flannel; \
    ln -s busybox /fs/bin/cp

FROM ${BUSYBOX_IMAGE} AS busybox

FROM scratch
ARG VERSION=dev
LABEL org.opencontainers.image.title="weft" \
      org.opencontainers.image.description="Flannel-compatible VXLAN overlay network: weftd node daemon and weft CNI plugin" \
      org.opencontainers.image.source="https://github.com/weft-net/weft" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=busybox /bin/busybox /bin/busybox
COPY --from=build /out/ /usr/local/bin/
# Flannel's paths, so that Flannel's own manifest runs weft with only its
# image references changed: weftd as /opt/bin/flanneld (started under that
# name it takes flanneld's flags and defaults), the weft plugin as /flannel
# (copied to /opt/cni/bin/flannel by `cp -f /flannel /opt/cni/bin/flannel`),
# and /opt/bin/install-conf.
# (/opt/bin/flanneld and /flannel are links to the binaries above, /bin/cp
# to busybox.)
COPY --from=build /fs/ /
ENV PATH=/usr/local/bin:/opt/bin:/bin
# No entrypoint: the binaries are on PATH, so `docker run weft weftd --version`,
# `docker run weft weftctl leases` and the DaemonSet's commands all work; a
# bare `docker run weft` runs weftd.
CMD ["weftd"]
