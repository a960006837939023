"""``python -m visualize p2p TRACE`` (``visualize/p2p.py``): one all-to-all as a rounds x ranks grid, its every
cell checked against the trace's ``p2p`` records read here, and the rounds against the schedule's pairs."""
import collections
import json
import re
import subprocess
import sys

from conftest import ROOT, run_ranks

from collectives.graph.p2p_schedule import p2p_schedule


def test_all_to_all_grid_says_what_the_trace_recorded(tmp_path):
    trace = tmp_path / "trace"
    run_ranks(4, "alltoall", json.dumps([5000]), json.dumps(["float32"]), nodes=2, script="p2p_workers.py",
              env={"NCCLLAB_TRACE": str(trace)})
    out = tmp_path / "a2a"
    proc = subprocess.run([sys.executable, "-m", "visualize", "p2p", str(trace), "-o", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    dot = (tmp_path / "a2a.dot").read_text()
    assert (tmp_path / "a2a.png").stat().st_size > 1000 and "rank 3" in (tmp_path / "a2a.svg").read_text()
    found = {(int(a), int(b)): body for a, b, body in re.findall(r'<td id="cell_(\d+)_(\d+)"[^>]*>(.*?)</td>', dot)}
    cells = collections.defaultdict(dict)  # (round, rank) -> {is_send: [peer, channels, bytes]}
    for rank in range(4):
        events = [json.loads(line) for line in open(trace / f"trace-rank{rank}.jsonl")][1:]
        last = max(e["plan"] for e in events if e["kind"] == "p2p")
        for e in events:
            if e["kind"] == "p2p" and e["plan"] == last:
                side = cells[(e["round"], rank)].setdefault(e["is_send"], [e["peer"], set(), 0])
                side[1].add(e["channel"])
                side[2] += e["bytes"]
    node_of = [0, 0, 1, 1]
    assert set(found) == {(rnd, r) for rnd in range(4) for r in range(4)}
    for (rnd, r), body in found.items():
        sides = cells.get((rnd, r), {})
        send_to, recv_from = p2p_schedule(r, node_of)[rnd]
        if send_to == r:  # round 0: the copy to itself, recorded once, on the send side
            assert set(sides) == {True} and sides[True][0] == r, (rnd, r, sides)
        else:
            assert sides[True][0] == send_to and sides[False][0] == recv_from, (rnd, r, sides)
        assert all(side[2] == 5000 * 4 for side in sides.values())  # each peer's block, both ways
        for is_send, (peer, chans, nbytes) in sides.items():
            chans = ",".join(map(str, sorted(chans)))
            text = (f"self copy  ch {chans}  {nbytes} B" if peer == r else
                    f"{'-&gt;' if is_send else '&lt;-'} {peer}  ch {chans}  {nbytes} B")
            assert text in body, (rnd, r, text, body)
    assert "sends to rank P" in dot and "receives from rank Q" in dot  # the legend
