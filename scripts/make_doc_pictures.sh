#!/usr/bin/env bash
# Regenerates the example pictures under docs/ (run from the repo root inside the venv: ./lab makes one).
set -euo pipefail
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# A traced 4-rank ring allreduce on 2 rings (4 channels after Postset doubling), a non-identity ring on channel 1.
NCCLLAB_TRACE="$TMP/trace" NCCLLAB_RINGS="0 1 2 3|0 2 1 3" \
  python -m collectives.ring -g 4 -b 256K -e 256K -n 1 -w 0 >/dev/null
python -m visualize topology "$TMP/trace" -o "$TMP/topology"
python -m visualize flow "$TMP/trace" -o "$TMP/chunk-flow" --title "ring AllReduce, 4 ranks, channel 0: who sends which chunk"
# The trees NCCL builds for 4 nodes x 2 ranks (our connectTrees; no run needed).
python - "$TMP/trees" <<'PY'
import sys
from collectives.graph.trees import channel_trees
from visualize import diagrams
tl = channel_trees([[0, 1, 2, 3, 4, 5, 6, 7]], [0, 0, 1, 1, 2, 2, 3, 3])
trees = [{r: (n.up, list(n.down)) for r, n in t.items()} for t in tl]
diagrams.render(diagrams.trees(trees, 8, "double binary tree, 4 nodes x 2 ranks (BALANCED_TREE)"), sys.argv[1],
                formats=("png",))
PY
# A sweep of ours against MPI on 2 ranks, with NCCL's cost model for this CPU.
mpirun -n 2 python benchmarks/allreduce_vs_mpi.py -b 8 -e 16M -f 4 --json "$TMP/bench.json" >/dev/null
python -m collectives.tune --preset cpu --gpus 2 -b 8 -e 16M -f 4 --series "$TMP/model.json" >/dev/null
python -m visualize curves "$TMP/bench.json" "$TMP/model.json" -o "$TMP/curve.png" --title "AllReduce, 2 ranks on 2 cores"
for f in topology chunk-flow trees curve; do cp "$TMP/$f.png" "docs/$f.png"; done
ls -la docs/*.png
