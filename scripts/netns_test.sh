#!/usr/bin/env bash
# Two "nodes" on one machine with a real network path between them: network namespaces nccllab-a and nccllab-b
# joined by a veth pair (10.231.0.1 <-> 10.231.0.2), two ranks in each, NET/Socket between the namespaces and
# SHM inside each.  Needs root and iproute2.  Optional: NETNS_RATE=1gbit shapes both ends with tc tbf (netem is
# missing from some kernels, so no latency is injected here).  NETNS_SIZES overrides the sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
[ -z "$PY" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
PY=${PY:-$(command -v python3)}
A=nccllab-a; B=nccllab-b
cleanup() { ip netns del $A 2>/dev/null || true; ip netns del $B 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add $A
ip netns add $B
ip link add veth-a netns $A type veth peer name veth-b netns $B
ip -n $A addr add 10.231.0.1/24 dev veth-a
ip -n $B addr add 10.231.0.2/24 dev veth-b
for ns in $A $B; do ip -n $ns link set lo up; done
ip -n $A link set veth-a up
ip -n $B link set veth-b up
if [ -n "${NETNS_RATE:-}" ]; then
  ip netns exec $A tc qdisc add dev veth-a root tbf rate "$NETNS_RATE" burst 256kb latency 50ms
  ip netns exec $B tc qdisc add dev veth-b root tbf rate "$NETNS_RATE" burst 256kb latency 50ms
fi
PORT=$(( 20000 + RANDOM % 20000 ))
MAGIC=$(printf '0x%x' $(( (RANDOM << 16) | RANDOM | 1 )))
read -r -a SIZES <<< "${NETNS_SIZES:--b 8 -e 64M -f 8}"
pids=()
for r in 0 1 2 3; do
  if [ $r -lt 2 ]; then ns=$A; dev=veth-a; else ns=$B; dev=veth-b; fi
  ip netns exec $ns env NCCLLAB_RANK=$r NCCLLAB_NRANKS=4 NCCL_COMM_ID=10.231.0.1:$PORT NCCLLAB_COMM_MAGIC=$MAGIC \
    NCCL_HOSTID=$ns NCCL_SOCKET_IFNAME=$dev NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET \
    "$PY" -m collectives.ring "${SIZES[@]}" -n 5 -w 1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
