"""Bandwidth against message size (matplotlib, log axes): algbw and busbw of any mix of
* our runs (``python -m collectives.ring --json``: records with size, algbw, busbw, placement);
* real NCCL ``all_reduce_perf`` output as nccl-tests prints it or users paste it (either row format, several tables
  per file, launcher prefixes, interleaved logs); its legend says ``nodes x GPUs`` per node when the output lists
  the ranks' hosts;
* series files ``{"label": ..., "points": [{"size", "busbw", "algbw"?}]}``: MPI baselines from
  ``benchmarks/allreduce_vs_mpi.py --json`` and the cost model's prediction from ``collectives.tools.tune --series``.

nccl-tests text is streamed (``nccl_tests.parse_file``); JSON is read whole up to ``MAX_JSON_BYTES``, and a JSON
that is neither rows nor series is one line of error.  More than ``MAX_SERIES`` series (a paste of hundreds of
runs) is refused in one line rather than drawn as a legend nobody can read.
"""
from __future__ import annotations

import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from . import nccl_tests  # noqa: E402


MAX_JSON_BYTES = 64 << 20   # a JSON input is read whole; a sweep's rows or series take a few KB
MAX_SERIES = 64             # series on one plot (a legend of more cannot be read); nccl-tests files can hold more


def _first_char(path: str) -> str:
    with open(path, errors="replace") as f:
        while True:
            chunk = f.read(4096)
            if not chunk or chunk.strip():
                return chunk.strip()[:1]


def load_series(path: str) -> list[dict]:
    """Every series in ``path``: [{'label', 'size': [...], 'algbw': [...|None], 'busbw': [...]}].  nccl-tests text
    is streamed (``nccl_tests.parse_file``); JSON is read whole, up to ``MAX_JSON_BYTES``."""
    name = os.path.basename(path)
    if _first_char(path) in ("{", "["):
        if os.path.getsize(path) > MAX_JSON_BYTES:
            raise ValueError(f"{path}: JSON of {os.path.getsize(path) >> 20} MiB; runner rows and series are read "
                             f"up to {MAX_JSON_BYTES >> 20} MiB")
        with open(path, errors="replace") as f:
            doc = json.load(f)
        try:
            return _json_series(doc, name)
        except (KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"{path}: JSON that is neither runner --json rows nor series files "
                             f"({type(exc).__name__}: {exc})") from None
    tables = nccl_tests.parse_file(path)
    if not tables:
        raise ValueError(f"{path}: no nccl-tests table (no rows 'size count type redop [root] time algbw busbw "
                         f"#wrong ...') and not JSON rows or series")

    def shape(t) -> str:  # nodes x GPUs per node, from the "# Rank ... on host" lines
        return f" ({t.shape[0]} x {t.shape[1]} GPUs)" if t.shape else ""
    return [{"label": f"NCCL: {name}" + (f" #{i + 1}" if len(tables) > 1 else "") + shape(t),
             "size": [r.size for r in t.rows], "algbw": [r.out_of_place["algbw"] for r in t.rows],
             "busbw": [r.out_of_place["busbw"] for r in t.rows]} for i, t in enumerate(tables)]


def _number(x, what: str):
    """A point's coordinate: a number (or None where allowed), else TypeError, which load_series reports."""
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)):
        if x is None and what != "size":
            return None
        raise TypeError(f"{what} {x!r} is not a number")
    return x


def _json_series(doc, name: str) -> list[dict]:
    if isinstance(doc, dict):
        doc = [doc]
    if not isinstance(doc, list) or not doc or not all(isinstance(d, dict) for d in doc):
        raise TypeError("not a list of records")
    if "points" in doc[0]:  # series files (MPI baseline, cost model)
        return [{"label": str(d.get("label", name)), "size": [_number(p["size"], "size") for p in d["points"]],
                 "algbw": [_number(p.get("algbw"), "algbw") for p in d["points"]],
                 "busbw": [_number(p["busbw"], "busbw") for p in d["points"]]} for d in doc]
    rows = [r for r in doc if r.get("placement", "out-of-place") == "out-of-place"]  # runner records
    if not rows:
        raise KeyError("no out-of-place rows")
    algos = "/".join(sorted({str(r["algo"]) for r in rows if r.get("algo")}, reverse=True))
    label = f"nccl-lab {rows[0].get('coll', '')} {algos} n={rows[0]['nranks']}".replace("  ", " ")
    return [{"label": label, "size": [_number(r["size"], "size") for r in rows],
             "algbw": [_number(r["algbw"], "algbw") for r in rows],
             "busbw": [_number(r["busbw"], "busbw") for r in rows]}]


def _unique(series: list[dict], skip: tuple = ()) -> list[dict]:
    """Drop series whose label contains a ``skip`` text (the same measurement given twice); a label that still
    repeats names its file, so that no two legend entries read alike."""
    kept, seen = [], {}
    for s in series:
        if any(x in s["label"] for x in skip):
            continue
        seen[s["label"]] = seen.get(s["label"], 0) + 1
        if seen[s["label"]] > 1:
            s = {**s, "label": f"{s['label']} ({s['file']})"}
        kept.append(s)
    return kept


def model_note(series: list[dict]) -> str:
    """Why the cost model's cpu-lab line sits above our measurement, with the measured factor.  The preset's
    constants were measured on an idle machine with one rank per core (n=2 on 2 cores); NCCL's model knows one GPU
    per rank and no time-sharing, so with more ranks than cores every step costs several times the measured
    constants (docs/measured.md has a run)."""
    models = [s for s in series if s["label"].startswith("NCCL model: cpu-lab")]
    ours = [s for s in series if s["label"].startswith("nccl-lab")]
    ratios = []
    for m in models:
        pred = {x: y for x, y in zip(m["size"], m["busbw"]) if y and y > 0}
        for o in ours:
            ratios += [pred[x] / y for x, y in zip(o["size"], o["busbw"]) if x in pred and y and y > 0]
    if not ratios or max(ratios) < 2:
        return ""
    return (f"The cpu-lab model sits {min(ratios):.0f}-{max(ratios):.0f}x above what was measured (busbw): its "
            f"constants were measured on an idle machine with one rank per core (n=2 on 2 cores), and NCCL's model "
            f"knows no time-sharing; when ranks outnumber cores, or other work shares them, every step costs "
            f"several times more. See docs/cost_model.md.")


def plot(inputs: list[str], out: str, title: str = "", skip: tuple = ()) -> str:
    series = _unique([{**s, "file": os.path.basename(path)} for path in inputs for s in load_series(path)], skip)
    if len(series) > MAX_SERIES:
        raise ValueError(f"{len(series)} series to plot; a legend of more than {MAX_SERIES} cannot be read (leave some "
                         f"out with --skip, or split the input)")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key in zip(axes, ("algbw", "busbw")):
        for i, s in enumerate(series):  # one colour per series in both panels (the legend is on one)
            pts = [(x, y) for x, y in zip(s["size"], s[key]) if y is not None and y > 0 and x > 0]
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, label=s["label"], color=f"C{i % 10}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(f"{key} (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(title or "bandwidth against message size")
    note = model_note(series)
    fig.tight_layout(rect=(0, 0.07 if note else 0, 1, 1))
    if note:
        fig.text(0.01, 0.01, note, fontsize=8, wrap=True)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def panel_of(label: str) -> int | None:
    """The rank count a series' label names ("... n=4, ..."): its panel in ``plot_panels``."""
    import re
    m = re.search(r"\bn=(\d+)\b", label)
    return int(m.group(1)) if m else None


def plot_panels(inputs: list[str], out: str, title: str = "") -> dict[str, dict[str, list[tuple]]]:
    """busbw against size, one panel per rank count (the ``n=N`` of each series' label; ``./lab bench``'s lab, MPI
    and Gloo series), the panels side by side.  Returns what was drawn, read back from the figure's axes:
    {panel title: {series label: [(size, busbw), ...]}}, so that a test checks the picture, not the inputs."""
    series = _unique([{**s, "file": os.path.basename(path)} for path in inputs for s in load_series(path)])
    panels: dict[int, list[dict]] = {}
    for s in series:
        n = panel_of(s["label"])
        if n is None:
            raise ValueError(f"{s['file']}: series '{s['label']}' names no rank count (n=N): no panel to put it in")
        panels.setdefault(n, []).append(s)
    if not panels:
        raise ValueError("no series to plot")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    drawn: dict[str, dict[str, list[tuple]]] = {}
    for ax, n in zip(axes[0], sorted(panels)):
        for i, s in enumerate(panels[n]):
            pts = [(x, y) for x, y in zip(s["size"], s["busbw"]) if y is not None and y > 0 and x > 0]
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, label=s["label"], color=f"C{i % 10}")
        ax.set_title(f"n = {n}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        drawn[ax.get_title()] = {line.get_label(): list(zip(*(list(map(float, d)) for d in line.get_data())))
                                 for line in ax.get_lines()}
    fig.suptitle(title or "AllReduce busbw against message size, one panel per rank count")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return drawn
