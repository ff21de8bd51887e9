#!/usr/bin/env bash
# build.sh [NAME] - the image the container tests run (tests/check_image.c):
# Debian 12 minbase with python3 and a marker file /etc/trainyard-image,
# made offline from Debian's packages by mmdebstrap and imported into
# podman's store. Built once: an image of that name already there is kept.
set -euo pipefail
name=${1:-localhost/trainyard-test:bookworm-py3}
if podman image exists "$name"; then exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "building $name with mmdebstrap (about 20 s, once)" >&2
mmdebstrap --quiet --variant=minbase --include=python3 \
  --customize-hook='echo "trainyard test image" > "$1/etc/trainyard-image"' \
  bookworm "$tmp/rootfs.tar"
podman import --quiet "$tmp/rootfs.tar" "$name" >/dev/null
