"""``python -m tracing perfetto|csv|json|merge|hang DIR [-o OUT]``: convert a run's trace or diagnose a hang."""
from __future__ import annotations

import argparse
import json
import sys

from . import export, hang


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracing")
    p.add_argument("what", choices=["perfetto", "csv", "json", "merge", "hang"])
    p.add_argument("dir", help="the NCCLLAB_TRACE (or hang report) directory")
    p.add_argument("-o", "--out", help="output file (default: stdout for hang, DIR/<name> otherwise)")
    a = p.parse_args(argv)
    if a.what == "hang":
        verdict = hang.diagnose(a.dir)
        print(verdict["reason"])
        for line in verdict["waits"]:
            print("  " + line)
        return 0 if verdict["culprit"] is not None else 1
    default = {"perfetto": "trace.perfetto.json", "csv": "chunks.csv", "json": "chunks.json", "merge": "merged.jsonl"}
    out = a.out or f"{a.dir.rstrip('/')}/{default[a.what]}"
    if a.what == "perfetto":
        with open(out, "w") as f:
            json.dump(export.perfetto(a.dir), f)
    elif a.what == "csv":
        export.write_csv(export.movements(a.dir), out)
    elif a.what == "json":
        with open(out, "w") as f:
            json.dump(export.movements(a.dir), f)
    else:
        export.merge(a.dir, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
