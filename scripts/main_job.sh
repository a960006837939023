#!/usr/bin/env bash
# The README's main job, after ./lab has built the environment: NCCL's ring allreduce on 8 ranks under mpirun,
# then, into one folder (default nccllab-out/): the nccl-tests table and JSON, the same for the tree AllReduce,
# the replay of a real 2x8 H100 log's trees, a traced run with its Perfetto file and chunk CSV, a traced tree run
# on 4 emulated nodes, the diagrams, the explained logs, MPI's curve, NCCL's cost-model curve and the plot.
set -euo pipefail
OUT=${NCCLLAB_OUT:-nccllab-out}
# One machine: bootstrap and sockets on loopback (NCCL's default would pick the first non-loopback interface).
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
N=${NRANKS:-8}
rm -rf "$OUT" && mkdir -p "$OUT"
FIXTURES=../shared/fixtures
# The runner flags given to ./lab main reach every run: the tree runs drop --coll (the tree is AllReduce only),
# the traced runs also drop the size and iteration flags (they trace one 1 MiB collective); the side-by-side MPI
# run takes the sizes and iteration counts (it is AllReduce float32 sum), the cost model's series the sizes.
short() {  # the runner's long flag names as nccl-tests' short ones
  local name=$1  # (printf, not echo: echo would take -e and -n as its own options)
  case "$1" in
    --minbytes) name=-b ;; --maxbytes) name=-e ;; --stepfactor) name=-f ;; --stepbytes) name=-i ;;
    --iters) name=-n ;; --warmup_iters) name=-w ;; --check) name=-c ;;
  esac
  printf '%s\n' "$name"
}
without() {  # without "FLAG..." ARGS...: ARGS less each FLAG and its value
  local drop=" $1 " skip=0 arg
  shift
  for arg in "$@"; do
    if [ "$skip" = 1 ]; then skip=0; continue; fi
    case "$drop" in *" $(short "$arg") "*) skip=1; continue ;; esac
    printf '%s\n' "$arg"
  done
}
only() {  # only "FLAG..." ARGS...: each FLAG of ARGS with its value (short names)
  local keep=" $1 " take=0 arg
  shift
  for arg in "$@"; do
    if [ "$take" = 1 ]; then take=0; printf '%s\n' "$arg"; continue; fi
    arg=$(short "$arg")
    case "$keep" in *" $arg "*) take=1; printf '%s\n' "$arg" ;; esac
  done
}
mapfile -t TREE_ARGS < <(without "--coll" "$@")
mapfile -t TRACE_ARGS < <(without "-b -e -f -i -n -w -c --json" "$@")
mapfile -t TRACE_TREE_ARGS < <(without "--coll -b -e -f -i -n -w -c --json" "$@")
mapfile -t MPI_ARGS < <(only "-b -e -f -i -n -w" "$@")
mapfile -t SIZE_ARGS < <(only "-b -e -f -i" "$@")

echo "== mpirun -n $N python -m collectives.ring $*"
mpirun -n "$N" python -m collectives.ring -b 8 -e 64M -f 2 -w 2 -n 10 --json "$OUT/ring.json" "$@" | tee "$OUT/ring.txt"

echo "== mpirun -n $N python -m collectives.tree (NCCL's double-binary-tree AllReduce, same table)"
mpirun -n "$N" python -m collectives.tree -b 8 -e 64M -f 4 -w 1 -n 5 --json "$OUT/tree.json" ${TREE_ARGS[@]+"${TREE_ARGS[@]}"} \
  | tee "$OUT/tree.txt"
python -m collectives.tree --from-log tests/data/nccl_tests_319_2x8_h100_trees.log > "$OUT/replay-2x8-h100.txt" || true
tail -1 "$OUT/replay-2x8-h100.txt"

echo "== traced run (NCCLLAB_TRACE=$OUT/trace, NCCL_DEBUG=INFO)"
NCCLLAB_TRACE="$OUT/trace" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING NCCL_DEBUG_FILE="$OUT/nccl-debug.%p.log" \
  mpirun -n "$N" python -m collectives.ring -b 1M -e 1M -n 1 -w 0 -c 1 ${TRACE_ARGS[@]+"${TRACE_ARGS[@]}"} >/dev/null
cat "$OUT"/nccl-debug.*.log > "$OUT/nccl-debug.log" && rm -f "$OUT"/nccl-debug.*.log
python -m tracing perfetto "$OUT/trace" -o "$OUT/trace.perfetto.json"
python -m tracing csv "$OUT/trace" -o "$OUT/chunks.csv"

echo "== traced tree AllReduce on 4 emulated nodes x 2 ranks (NCCLLAB_TRACE=$OUT/trace-4x2): NET between nodes"
NCCLLAB_TRACE="$OUT/trace-4x2" python -m collectives.tree -g 8 --nodes 4 -b 1M -e 1M -n 1 -w 0 -c 0 \
  ${TRACE_TREE_ARGS[@]+"${TRACE_TREE_ARGS[@]}"} >/dev/null

echo "== diagrams"
python -m visualize topology "$OUT/trace-4x2" -o "$OUT/a-topology"     # 4 nodes: NET/Socket/0 between, SHM inside
python -m visualize trees "$OUT/trace-4x2" -o "$OUT/b-trees"           # tree 0 and tree 1 differ across 4 nodes
python -m visualize flow "$OUT/trace" -o "$OUT/c-chunk-flow"           # the ring AllReduce of the 8-rank run
python -m visualize flow "$OUT/trace-4x2" -o "$OUT/c-tree-flow"        # the tree AllReduce: up, then down
# The richest real log we ship: 2 nodes x 8 H100, 16 channels (NVIDIA/nccl-tests#319).
REAL_LOG=tests/data/nccl_tests_319_2x8_h100_trees.log
python -m visualize log "$REAL_LOG" -o "$OUT/d-from-log" --max-channels 2
python -m tracing explain "$REAL_LOG" -o "$OUT/explain-2x8-h100" | tail -3
python -m tracing explain "$OUT/nccl-debug.log" -o "$OUT/explain-this-run" | tail -3

echo "== curves: ours and MPI's (side by side in the same processes), the tree, NCCL's cost model for this CPU"
mpirun -n "$N" python benchmarks/allreduce_vs_mpi.py -b 8 -e 64M -f 4 ${MPI_ARGS[@]+"${MPI_ARGS[@]}"} \
  --json "$OUT/mpi.json" | tee "$OUT/mpi.txt"
python -m collectives.tools.tune --preset cpu --gpus "$N" -b 8 -e 64M -f 2 ${SIZE_ARGS[@]+"${SIZE_ARGS[@]}"} \
  --series "$OUT/model-cpu.json" >/dev/null
# Our ring's line is the one measured beside MPI's (mpi.json holds both): ring.json's runner sweep shares the
# machine with nothing to compare against, and one burst of this VM moves it by 5x (650-2,556 us at 8 B in one
# job whose side-by-side run read 86.5 us against MPI's 48.9).
INPUTS=("$OUT/mpi.json" "$OUT/tree.json" "$OUT/model-cpu.json")
python -m visualize curves "${INPUTS[@]}" -o "$OUT/curve.png" --title "AllReduce, $N ranks on this machine"
REAL_TESTS="$FIXTURES/nccl_tests/a3mega_2x8_h100_allreduce.txt"
if [ -f "$REAL_TESTS" ]; then
  python -m collectives.tools.tune --preset dgx-h100 --nodes 2 -b 8 -e 8G -f 2 --series "$OUT/model-h100x2.json" >/dev/null
  python -m visualize curves "$REAL_TESTS" "$OUT/model-h100x2.json" -o "$OUT/curve-real-nccl.png" \
    --title "real NCCL (2x8 H100) against NCCL's cost model"
fi
echo "== outputs in $OUT/"
ls "$OUT"
