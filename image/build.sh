#!/usr/bin/env bash
# Builds natgw's image from a clean clone with one command and no registry, as root:
#   1. a Debian root filesystem (debootstrap --variant=minbase), cached as a tarball outside
#      the checkout so later runs skip it; imported as the image's RUNTIME base;
#   2. the build stage's BASE: that Debian plus this machine's Node.js 24 (stripped) and npm
#      (image/Containerfile.base); only the node binary reaches the image;
#   3. `podman build` of image/Dockerfile, labelled with package.json's version and the checkout's
#      revision, tagged <version>-<short revision> and NATGW_IMAGE; the build stage's image is
#      removed afterwards (the two bases stay, cached).
# With a registry at hand, `podman build -f image/Dockerfile .` alone uses the official images.
#
# NATGW_IMAGE (localhost/natgw:dev), NATGW_IMAGE_CACHE (/var/cache/natgw-image),
# NATGW_IMAGE_SUITE (bookworm), NATGW_IMAGE_MIRROR (default: the first Debian archive this
# machine's apt sources name), NATGW_IMAGE_SOURCE (the OCI source label; default: the
# checkout's origin remote, if any) and
# NATGW_IMAGE_BUILD_CA (a CA bundle for npm in the build; default NODE_EXTRA_CA_CERTS) override.
# NATGW_IMAGE_ARCH=arm64 (a Debian architecture; default this machine's) builds for another
# architecture under emulation (Debian's qemu-user-static with binfmt_misc): Debian for that
# architecture, Node.js from the registry's node-linux-<arch> package of this machine's version;
# the tags get the architecture as a suffix.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${NATGW_IMAGE:-localhost/natgw:dev}
cache=${NATGW_IMAGE_CACHE:-/var/cache/natgw-image}
suite=${NATGW_IMAGE_SUITE:-bookworm}
host_arch=$(dpkg --print-architecture)
arch=${NATGW_IMAGE_ARCH:-$host_arch}
# Names of what is built for another architecture than this machine's carry it.
sfx=
if [ "$arch" != "$host_arch" ]; then
  sfx=-$arch
  [ -n "${NATGW_IMAGE:-}" ] || image=$image$sfx
fi
# The archive apt already uses here (deb822 or one-line sources), so the build reaches exactly
# what this machine's package manager reaches.
apt_mirror() {
  { grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}'
    grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '{print $2}'; } |
    grep -v -- '-security' | head -n1
} 2>/dev/null
# (a missing sources file is no error: the first URI found, or nothing)
mirror=${NATGW_IMAGE_MIRROR:-$(apt_mirror || true)}
[ -n "$mirror" ] || { echo "no Debian archive in the apt sources: set NATGW_IMAGE_MIRROR" >&2; exit 1; }

say() { printf '==> %s\n' "$*"; }

# The tools themselves (Debian packages), installed once.
need=()
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v fuse-overlayfs >/dev/null 2>&1 || need+=(fuse-overlayfs)
command -v strip >/dev/null 2>&1 || need+=(binutils)
if [ -n "$sfx" ]; then
  [ -e "/usr/libexec/qemu-binfmt/${arch/arm64/aarch64}-binfmt-P" ] || need+=(qemu-user-static binfmt-support)
fi
if [ "${#need[@]}" -gt 0 ]; then
  say "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# 1. The Debian root filesystem, cached.
mkdir -p "$cache"
rootfs_tar=$cache/debian-$suite$sfx-minbase-slim.tar
if [ ! -s "$rootfs_tar" ]; then
  say "debootstrap --variant=minbase $suite (a few minutes, once; cached in $rootfs_tar)"
  work=$(mktemp -d "$cache/rootfs.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  debootstrap --arch="$arch" --variant=minbase "$suite" "$work/root" "$mirror" >"$cache/debootstrap.log" 2>&1 || {
    tail -20 "$cache/debootstrap.log" >&2
    exit 1
  }
  r=$work/root
  # Package lists, apt's caches, documentation, manuals and translations are not part of a
  # base image (copyright files stay); dpkg leaves them out of later installs too, as in
  # Debian's slim images.
  rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/cache/apt/archives/*.deb
  find "$r/usr/share/doc" -mindepth 1 -not -type d -not -name copyright -delete
  rm -rf "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/usr/share/locale/*
  printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
    'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' 'path-exclude /usr/share/locale/*' \
    >"$r/etc/dpkg/dpkg.cfg.d/slim"
  printf '%s\n' 'APT::Install-Recommends "false";' >"$r/etc/apt/apt.conf.d/99no-recommends"
  tar --numeric-owner -C "$work/root" -cf "$rootfs_tar.part" .
  mv "$rootfs_tar.part" "$rootfs_tar"
  rm -rf "$work"
  trap - EXIT
fi

# 2. The build stage's base: Debian plus this machine's Node.js and npm.
node_bin=$(readlink -f "$(command -v node)")
node_version=$(node --version)
case $node_version in
  v24.*) ;;
  *) echo "the image needs Node.js 24; this machine has $node_version (scripts/setup.sh installs it)" >&2; exit 1 ;;
esac
# npm wherever it is installed (next to node in the official tarballs, /usr/lib elsewhere).
npm_dir=$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")
[ -f "$npm_dir/package.json" ] && [ -f "$npm_dir/bin/npm-cli.js" ] || {
  echo "npm not found (expected bin/npm-cli.js under $npm_dir)" >&2
  exit 1
}
debian_image=localhost/natgw-debian:$suite$sfx-minbase-slim
base_image=localhost/natgw-base:$suite-node${node_version#v}$sfx
if ! podman image exists "$debian_image"; then
  say "podman import $rootfs_tar → $debian_image"
  podman import --quiet --arch "$arch" "$rootfs_tar" "$debian_image" >/dev/null
fi
if ! podman image exists "$base_image"; then
  say "base image $base_image (Debian $suite + Node.js $node_version from $node_bin)"
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  if [ -z "$sfx" ]; then
    cp "$node_bin" "$ctx/node"
    # The release binary carries its symbol tables (about 18 MB) for debuggers; the image runs it.
    strip "$ctx/node"
  else
    # The same release for the other architecture, as the registry ships it (setup.sh's way).
    (cd "$ctx" && npm pack --silent "node-linux-${arch/amd64/x64}@${node_version#v}" >/dev/null &&
      tar -xzf node-linux-*.tgz package/bin/node && mv package/bin/node node && rm -rf package node-linux-*.tgz)
  fi
  cp -a "$npm_dir" "$ctx/npm"
  cp image/Containerfile.base "$ctx/Containerfile"
  # chroot isolation: the build's RUN steps need no OCI runtime (crun/runc cannot set rlimits here).
  # --layers=false: one image, no intermediate one per instruction left behind.
  podman build --quiet --isolation=chroot --network=host --layers=false --arch "$arch" --build-arg "DEBIAN=$debian_image" \
    -t "$base_image" "$ctx" >/dev/null
  rm -rf "$ctx"
  trap - EXIT
fi

# 3. natgw's image. npm in the build stage trusts what this machine's Node.js trusts.
secret=()
ca=${NATGW_IMAGE_BUILD_CA:-${NODE_EXTRA_CA_CERTS:-}}
[ -n "$ca" ] && [ -s "$ca" ] && secret=(--secret "id=build-ca,src=$ca")
version=$(node -p 'require("./package.json").version')
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
short=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# Uncommitted changes show in both: such an image is not the revision's.
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  revision=$revision-dirty
  short=$short-dirty
fi
# The origin remote as a web address, without any credentials it may carry.
source_url=${NATGW_IMAGE_SOURCE:-$(git remote get-url origin 2>/dev/null | sed -E 's#^(https?://)[^/@]*@#\1#; s#^git@([^:]+):#https://\1/#; s#\.git$##' || true)}
versioned=localhost/natgw:$version-$short$sfx
say "podman build image/Dockerfile (BASE=$base_image) → $versioned, $image"
previous=$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
# --layers=false: no intermediate image per instruction. The build stage's own image remains,
# untagged; it carries the stage's label (io.natgw.stage=build) and goes, with any such
# leftover of an earlier build.
podman build --isolation=chroot --network=host --layers=false \
  --arch "$arch" --build-arg "BASE=$base_image" --build-arg "RUNTIME=$debian_image" \
  --build-arg "NODE_STRIPPED=$([ -z "$sfx" ] && echo 1 || echo 0)" \
  --build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "SOURCE=$source_url" \
  "${secret[@]}" -f image/Dockerfile -t "$versioned" -t "$image" .
for id in $(podman images -a -q --filter label=io.natgw.stage=build); do
  podman rmi -f "$id" >/dev/null
done
# The image the tag named before, if nothing names it now (a container still using it keeps it).
if [ -n "$previous" ] && [ "$previous" != "$(podman image inspect --format '{{.Id}}' "$image")" ] &&
  [ -z "$(podman image inspect --format '{{join .RepoTags ""}}' "$previous" 2>/dev/null)" ]; then
  podman rmi "$previous" >/dev/null 2>&1 || true
fi
size=$(podman image inspect --format '{{.Size}}' "$image")
say "built $versioned ($image): $((size / 1000000)) MB ($size bytes)"
