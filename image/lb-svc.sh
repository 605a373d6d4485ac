#!/usr/bin/env bash
# Kube-OVN's LoadBalancer-service pods run `bash /kube-ovn/lb-svc.sh <command> [rule ...]` in the
# same image as the NAT gateway (container `lb-svc`): init, eip-add, dnat-add, dnat-del. natgw
# answers them in-process (`natgw lb-svc …`, src/lbsvc): a handful of commands per pod needs no
# daemon. Output and status are natgw's; this file only finds it.
case ${BASH_SOURCE[0]} in
  */*) here=${BASH_SOURCE[0]%/*} ;;
  *) here=. ;;
esac
# Inside the image natgw lives under /kube-ovn/natgw; in a checkout it is the checkout this file sits in.
if [ -f "$here/natgw/bin/natgw.js" ]; then
  entry="$here/natgw/bin/natgw.js"
else
  entry="$here/../bin/natgw.js"
fi
exec node "$entry" lb-svc "$@"
