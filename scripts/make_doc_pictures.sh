#!/usr/bin/env bash
# Regenerates docs/topology.png and docs/trees.png (run from the repo root inside the venv: ./lab makes one).
# docs/chunk-flow.png, docs/curve.png and the book's pictures under docs/book/ come from scripts/make_docs.py.
set -euo pipefail
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# Two NDv5 nodes from the multi-node search: their NICs and ring channel 0 across them (docs/cluster.md).
python -m visualize topo topologies/azure-ndv5-topo.xml --sm 90 --nodes 2 -o "$TMP/topology"
# The trees NCCL builds for 4 nodes x 2 ranks, from a traced tree AllReduce (edges carry their transports).
NCCLLAB_TRACE="$TMP/tree" python -m collectives.tree -g 8 --nodes 4 -b 1M -e 1M -n 1 -w 0 -c 0 >/dev/null
python -m visualize trees "$TMP/tree" -o "$TMP/trees" --title "double binary tree, 4 nodes x 2 ranks (BALANCED_TREE)"
for f in topology trees; do cp "$TMP/$f.png" "docs/$f.png"; done
ls -la docs/*.png
