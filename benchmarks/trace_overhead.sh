#!/usr/bin/env bash
# Cost of the tracing hooks when tracing is off: this tree against the commit before tracing existed, run
# alternately (the machine is noisy), medians of REPS runs of the nccl-tests runner, 2 ranks, times in us.
#   benchmarks/trace_overhead.sh [REPS [RUNNER FLAGS...]]
# RUNNER FLAGS go after the defaults below, so they override them (argparse keeps the last): `1 -e 8 -n 2 -w 1`
# is a one-row check that the script still runs.
set -euo pipefail
REPS=${1:-5}
shift $(( $# > 0 ? 1 : 0 ))
FLAGS=("$@")
BASE=$(git log --format=%H --grep="Chunk-level tracing" | tail -1)~1
WT=$(mktemp -d)/base
git worktree add -q "$WT" "$BASE"
trap 'git worktree remove --force "$WT"' EXIT
run() { (cd "$1" && PYTHONPATH="$1" python -m collectives.ring -g 2 -b 8 -e 2M -f 16 -w 20 -n 300 -c 0 \
           ${FLAGS[@]+"${FLAGS[@]}"} |
         awk '/^ +[0-9]/ {printf "%s %s\n", $1, $6}'); }
for i in $(seq "$REPS"); do
  run "$PWD" | sed 's/^/now /'
  run "$WT" | sed 's/^/base /'
done | python -c '
import sys, statistics, collections
t = collections.defaultdict(list)
for line in sys.stdin:
    who, size, us = line.split(); t[(who, int(size))].append(float(us))
print("%10s %9s %9s %9s" % ("size", "base us", "now us", "overhead"))
for size in sorted({s for _, s in t}):
    b, n = statistics.median(t[("base", size)]), statistics.median(t[("now", size)])
    print(f"{size:>10} {b:>9.1f} {n:>9.1f} {100 * (n / b - 1):>8.1f}%")'
