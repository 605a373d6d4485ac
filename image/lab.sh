#!/usr/bin/env bash
# The lab against natgw's image, as root: builds the image if it is missing (image/build.sh),
# then runs scripts/imageLab.ts — the lab for both backends and the no-zombie check, natgw
# driven only through the image's /kube-ovn/nat-gateway.sh. NATGW_IMAGE names the image
# (localhost/natgw:dev); NATGW_IMAGE_REBUILD=1 rebuilds it first.
set -euo pipefail
cd "$(dirname "$0")/.."
image=${NATGW_IMAGE:-localhost/natgw:dev}
if [ "${NATGW_IMAGE_REBUILD:-0}" = 1 ] || ! podman image exists "$image" 2>/dev/null; then
  bash image/build.sh
fi
# The lab's own side (namespaces, traffic, checks) runs from the checkout.
[ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error
npm run build --silent
exec node dist/scripts/imageLab.js "$image"
