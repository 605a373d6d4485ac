#!/usr/bin/env bash
# The image lab's stand-in for a container runtime where none works (scripts/imageLab.ts):
# gives the image's root filesystem (a `podman mount`ed container) the kernel filesystems a
# runtime would, then runs the command chrooted into it. Run in a mount namespace of its own
# (`ip netns exec` and `unshare --mount-proc` make one), so these mounts end with it; /sys
# there is the network namespace's own, as in a pod.
set -euo pipefail
root=$1
shift
[ -x "$root/kube-ovn/nat-gateway.sh" ] || { echo "chroot-enter: $root is not a natgw image root" >&2; exit 2; }
for fs in proc sys dev; do
  mount --rbind "/$fs" "$root/$fs"
done
exec chroot "$root" "$@"
