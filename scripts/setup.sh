#!/usr/bin/env bash
# Everything natgw's lab and tests need on a Debian machine, as root. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
# curl: the shim's client for a running daemon (image/nat-gateway.sh), as in the image.
pkgs=(nftables iptables iproute2 conntrack conntrackd iputils-arping ipv6toolkit iputils-ping tcpdump procps ca-certificates curl)
command -v node >/dev/null 2>&1 || pkgs+=(nodejs npm)
# NATGW_IMAGE_TOOLS=1: what image/build.sh and image/lab.sh need besides (not part of npm test).
if [ "${NATGW_IMAGE_TOOLS:-0}" = 1 ]; then pkgs+=(podman debootstrap fuse-overlayfs util-linux); fi
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "natgw needs Node.js >= 20 (found $(node --version)); Debian 13 ships it as nodejs" >&2
  exit 1
fi

npm ci --no-audit --no-fund --loglevel=error
# The compiled CLI, so `bash image/nat-gateway.sh …` and `npx natgw …` run from the checkout.
npm run build --silent
