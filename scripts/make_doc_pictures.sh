#!/usr/bin/env bash
# Regenerates the example pictures under docs/ (run from the repo root inside the venv: ./lab makes one).
set -euo pipefail
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# A traced 4-rank ring AllReduce on 2 emulated nodes (NET between them, SHM inside), 2 rings (4 channels after
# Postset doubling), a non-identity ring on channel 1.
NCCLLAB_TRACE="$TMP/trace" NCCL_GRAPH_FILE=topologies/graphs/lab-two-rings.xml NCCL_ALGO=Ring \
  python -m collectives.ring -g 4 --nodes 2 -b 256K -e 256K -n 1 -w 0 >/dev/null
python -m visualize topology "$TMP/trace" -o "$TMP/topology"
python -m visualize flow "$TMP/trace" -o "$TMP/chunk-flow" --title "ring AllReduce, 4 ranks, channel 0: who sends which chunk"
# The trees NCCL builds for 4 nodes x 2 ranks, from a traced tree AllReduce (edges carry their transports).
NCCLLAB_TRACE="$TMP/tree" python -m collectives.tree -g 8 --nodes 4 -b 1M -e 1M -n 1 -w 0 -c 0 >/dev/null
python -m visualize trees "$TMP/tree" -o "$TMP/trees" --title "double binary tree, 4 nodes x 2 ranks (BALANCED_TREE)"
# A sweep of ours against MPI on 2 ranks, with NCCL's cost model for this CPU.
mpirun -n 2 python benchmarks/allreduce_vs_mpi.py -b 8 -e 16M -f 4 --json "$TMP/bench.json" >/dev/null
python -m collectives.tools.tune --preset cpu --gpus 2 -b 8 -e 16M -f 4 --series "$TMP/model.json" >/dev/null
python -m visualize curves "$TMP/bench.json" "$TMP/model.json" -o "$TMP/curve.png" --title "AllReduce, 2 ranks on 2 cores"
for f in topology chunk-flow trees curve; do cp "$TMP/$f.png" "docs/$f.png"; done
ls -la docs/*.png
