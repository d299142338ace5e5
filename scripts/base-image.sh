#!/usr/bin/env bash
# base-image.sh builds berth's offline Debian 12 base image, berth-base:bookworm
# (image_config's default base_image), from Debian's packages alone: no
# registry. debootstrap (minbase: dpkg, apt and the essential set) through the
# apt mirror this machine is configured with, then `docker import`.
#
# The rootfs tarball is cached next to the install test's
# (/var/cache/berth-install-test, BERTH_BASE_CACHE overrides), so a second run
# only imports; an image that is already there is kept (--force rebuilds it).
#
#   scripts/base-image.sh [--force] [--tag berth-base:bookworm]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

tag=berth-base:bookworm
force=
while (($#)); do
  case $1 in
    --force) force=1 ;;
    --tag) tag=$2; shift ;;
    -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/base-image.sh must run as root (debootstrap, docker)" >&2
  exit 1
fi
ensure_packages debootstrap:debootstrap
ensure_docker

suite=bookworm
cache=${BERTH_BASE_CACHE:-/var/cache/berth-install-test}
tarball=$cache/$suite-minbase.tar

if [ -z "$force" ] && docker image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag is present ($(docker image inspect --format '{{.Id}}' "$tag"))"
  exit 0
fi

mirror() {
  local uri
  uri=$(awk '/^URIs:/ && !done { print $2; done=1 }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  if [ -z "$uri" ]; then
    uri=$(awk '$1 == "deb" && $3 ~ /^bookworm$/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
  fi
  [ -n "$uri" ] || { echo "cannot find a Debian mirror in /etc/apt/sources.list*" >&2; return 1; }
  printf '%s\n' "$uri"
}

if [ -n "$force" ] || [ ! -s "$tarball" ]; then
  mkdir -p "$cache"
  rootfs=$cache/base-rootfs.tmp
  rm -rf "$rootfs"
  echo "==> debootstrap $suite (minbase) from the configured mirror" >&2
  debootstrap --variant=minbase "$suite" "$rootfs" "$(mirror)" >"$cache/base-debootstrap.log" 2>&1 ||
    { tail -20 "$cache/base-debootstrap.log" >&2; exit 1; }
  # An image needs no package lists or caches: berth-imaged brings the .debs.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
  tar -C "$rootfs" --numeric-owner -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
  rm -rf "$rootfs"
fi

echo "==> docker import $tag" >&2
docker import --change 'CMD ["/bin/bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  "$tarball" "$tag" >/dev/null
echo "$tag is present ($(docker image inspect --format '{{.Id}}' "$tag"))"
