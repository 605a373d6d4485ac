#!/usr/bin/env bash
# The controller runs `bash /kube-ovn/nat-gateway.sh <command> [rule ...]`. This shim hands
# every argument, untouched, to natgw: inside the image natgw lives under /kube-ovn/natgw;
# in a checkout it is the checkout this file sits in.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -f "$here/natgw/bin/natgw.js" ]; then
  entry="$here/natgw/bin/natgw.js"
else
  entry="$here/../bin/natgw.js"
fi
exec node "$entry" "$@"
