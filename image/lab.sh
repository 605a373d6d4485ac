#!/usr/bin/env bash
# The lab against natgw's image, as root: builds the image if it is missing (image/build.sh),
# then runs scripts/imageLab.ts — the lab for both backends and the no-zombie check, natgw
# driven only through the image's /kube-ovn/nat-gateway.sh. NATGW_IMAGE names the image
# (localhost/natgw:dev); NATGW_IMAGE_REBUILD=1 rebuilds it first.
set -euo pipefail
cd "$(dirname "$0")/.."
image=${NATGW_IMAGE:-localhost/natgw:dev}
# The host's side: the tools the lab's checks use, podman, npm ci and the build of the checkout.
NATGW_IMAGE_TOOLS=1 bash scripts/setup.sh
if [ "${NATGW_IMAGE_REBUILD:-0}" = 1 ] || ! podman image exists "$image" 2>/dev/null; then
  bash image/build.sh
fi
# The lab's own side (namespaces, traffic, checks) runs from the checkout; natgw runs from the image.
exec node dist/scripts/imageLab.js "$image"
