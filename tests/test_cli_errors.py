"""Trust before features (issue 24): what the command lines do with input that is not what they expect.

Each command refuses what it cannot read in one line on stderr with a non-zero status, never a traceback; what
decides "is an NCCL log" is NCCL's own line grammar (``src/debug.cc`` ``ncclDebugLog``); the topology loader
stops at NCCL's limits (``src/graph/topo.h``, ``src/include/graph.h``, ``src/graph/xml.h``); and the parsers'
cost is linear in time and bounded in memory (measured in a subprocess with ``resource.getrusage``)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT

DATA = Path(__file__).parent / "data"
H100 = DATA / "nccl_tests_319_2x8_h100_trees.log"
PY = sys.executable


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m ARGS`` in a subprocess."""
    return subprocess.run([PY, "-m", *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)


MAINS = {"tracing": "tracing.__main__", "visualize": "visualize.__main__", "collectives.tools.topology": "collectives.tools.topology",
         "collectives.tools.tune": "collectives.tools.tune", "collectives.graph.replay": "collectives.graph.replay"}


@pytest.fixture
def call(capsys):
    """``python -m ARGS`` run in this process (the command's ``main``): the same code, without a new
    interpreter's start-up per call; an exception escaping ``main`` fails the test as a traceback would."""
    import importlib

    def run(module: str, *args: str) -> subprocess.CompletedProcess:
        main = importlib.import_module(MAINS[module]).main
        capsys.readouterr()
        try:
            rc = main(list(args))
        except SystemExit as e:
            rc = e.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess([module, *args], rc, out.out, out.err)
    return run


def one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    """Refused: non-zero status, exactly one line on stderr, no traceback, and the line says why."""
    assert proc.returncode not in (0, None), (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    err = proc.stderr.strip()
    assert err and "\n" not in err and "Traceback" not in err, proc.stderr[-3000:]
    for w in words:
        assert w in err, err


def real_logs() -> list[Path]:
    logs = sorted(DATA.glob("*.log"))
    if (FIXTURES / "nccl_logs").is_dir():
        logs += sorted((FIXTURES / "nccl_logs").glob("*.log"))
    return logs


# --- 1. a file that is not an NCCL log ------------------------------------------------------------------------
@pytest.mark.parametrize("doc", ["README.md", "docs/trees.md", "pyproject.toml"])
def test_explain_and_log_refuse_documents_that_quote_nccl_lines(doc, tmp_path, call):
    """README.md quotes a few NCCL lines (bare and in backticks); it used to be explained as a 3-rank log, and
    ``visualize log`` printed an empty line.  The README through the real command lines, the others in-process."""
    out = tmp_path / "out"
    run = cli if doc == "README.md" else call
    one_line_error(run("tracing", "explain", str(ROOT / doc), "-o", str(out)), "not an NCCL")
    one_line_error(run("visualize", "log", str(ROOT / doc), "-o", str(out / "x")), "not an NCCL")
    one_line_error(cli("collectives.tree", "--from-log", str(ROOT / doc)) if doc == "README.md" else
                   call("collectives.graph.replay", str(ROOT / doc)), "not an NCCL")
    assert not out.exists()


@pytest.mark.parametrize("path", real_logs(), ids=lambda p: p.name)
def test_every_real_log_is_an_nccl_log(path):
    from tracing import nccl_log
    log = nccl_log.parse_file(str(path), strict=False)
    assert nccl_log.is_nccl_log(log), (path, log.grammar)


def test_a_bare_paste_is_an_nccl_log_and_a_few_quoted_lines_are_not(tmp_path, call):
    """Users paste NCCL's lines without the ``host:pid:tid [dev]`` prefix; that is still NCCL's grammar."""
    from tracing import nccl_log
    lines = [ln for ln in H100.read_text().splitlines() if " NCCL INFO " in ln]
    bare = tmp_path / "bare.log"
    bare.write_text("".join("NCCL INFO " + ln.split(" NCCL INFO ", 1)[1] + "\n" for ln in lines))
    assert nccl_log.is_nccl_log(nccl_log.parse_file(str(bare)))
    proc = call("tracing", "explain", str(bare), "-o", str(tmp_path / "b"))
    assert proc.returncode == 0, proc.stderr
    assert "ranks: 16" in proc.stdout and "matched 256 of 256" in proc.stdout
    prose = tmp_path / "prose.md"   # two quoted lines in a page of prose: not a log
    prose.write_text("text\n" * 200 + lines[0] + "\n" + "NCCL INFO " + lines[1].split(" NCCL INFO ", 1)[1] + "\n")
    assert not nccl_log.is_nccl_log(nccl_log.parse_file(str(prose)))


def test_a_log_with_nothing_to_draw_is_one_line(tmp_path, call):
    log = tmp_path / "comm.log"
    log.write_text("h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0\n"
                   "h:2:2 [1] NCCL INFO comm 0x2 rank 1 nRanks 2 nNodes 1 localRanks 2 localRank 1 MNNVL 0\n")
    one_line_error(call("visualize", "log", str(log), "-o", str(tmp_path / "x")), "nothing to draw")
    assert not list(tmp_path.glob("x*"))


# --- 2. ranks outside the communicator --------------------------------------------------------------------------
def _edit_first(pattern: str, repl: str, tmp_path: Path, name: str) -> Path:
    text, n = re.subn(pattern, repl, H100.read_text(), count=1)
    assert n == 1
    path = tmp_path / name
    path.write_text(text)
    return path


VIA = "lccn09:2520136:2520234 [0] NCCL INFO Channel 00/0 : 0[0] -> 99[1] via P2P/IPC\n"


@pytest.mark.parametrize("pattern,repl,bad", [
    (r"Trees \[0\] 1/8/-1->0->-1", "Trees [0] 1/-3/-1->0->-1", "-3"),        # child below -1
    (r"Trees \[0\] 1/8/-1->0->-1", "Trees [0] 1/99/-1->0->-1", "99"),        # child past nRanks
    (r"Trees \[0\] 1/8/-1->0->-1", "Trees [0] 1/8/-1->0->40", "40"),         # parent past nRanks
    (r"Trees \[0\] 15/-1/-1->14->13", "Trees [0] 15/-1/-1->16->13", "16"),  # the line's own rank
    (r"Channel 00/16 : +0 +7", "Channel 00/16 : 0 70", "70"),                  # a ring
    (r"\Z", VIA, "99"),                                                     # a transport edge
])
def test_invalid_ranks_are_unusual_never_a_traceback(pattern, repl, bad, tmp_path, call):
    """A Trees child of -3 was read as a child (a list index from the end); ranks past nRanks raised IndexError
    or KeyError in the diagrams.  NCCL prints -1 for "none" and 0..nRanks-1 otherwise."""
    path = _edit_first(pattern, repl, tmp_path, "odd.log")
    proc = call("tracing", "explain", str(path), "-o", str(tmp_path / "x"))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    report = (tmp_path / "x" / "report.txt").read_text()
    assert "unusual: nothing" not in report
    unusual = report.split("unusual:", 1)[1]
    assert re.search(rf"rank {re.escape(bad)}\b", unusual), unusual
    draw = call("visualize", "log", str(path), "-o", str(tmp_path / "y"))
    assert draw.returncode == 0 and "Traceback" not in draw.stderr, draw.stderr[-3000:]
    if "Trees" in repl:   # replaying trees with a rank no communicator has is refused, in one line
        one_line_error(call("collectives.graph.replay", str(path)), "line", bad)


def test_child_minus_three_on_one_node_is_unusual(tmp_path, call):
    """The 1 x 4 A100 fixture with rank 3's child -3: replay failed on a KeyError ("not checked by replay (-3)")
    and the report said 'unusual: nothing'."""
    log = FIXTURES / "nccl_logs" / "trainingoneks_1x4_a100_p4d.log"
    if not log.exists():
        pytest.skip("shared fixtures not present")
    odd = tmp_path / "a100.log"
    odd.write_text(log.read_text().replace("-1/-1/-1->3->2", "-3/-1/-1->3->2", 1))
    proc = call("tracing", "explain", str(odd), "-o", str(tmp_path / "x"))
    assert proc.returncode == 0, proc.stderr
    assert "unusual: nothing" not in proc.stdout and "names rank -3" in proc.stdout
    assert "replay (-3)" not in proc.stdout   # the entry is left out before the replay, not a KeyError in it


def test_from_log_refuses_an_invalid_rank_in_one_line(tmp_path):
    """``python -m collectives.tree --from-log`` (the command, in a subprocess)."""
    path = _edit_first(r"Trees \[0\] 1/8/-1->0->-1", "Trees [0] 1/-3/-1->0->-1", tmp_path, "m3.log")
    one_line_error(cli("collectives.tree", "--from-log", str(path)), "line", "-3")


# --- 3. topologies: bad links, many GPUs, NCCL's limits, no pickles ------------------------------------------
def topo_xml(ngpus: int, per_switch: int = 2, nvswitch: bool = True, sm: int = 90) -> str:
    """A synthetic node: 2 AMD sockets, ``per_switch`` GPUs per PCIe switch, every GPU 18 NVLinks to an NVSwitch."""
    out = ['<system version="1">']
    g = 0
    for c in range(2):
        out.append(f'  <cpu numaid="{c}" affinity="ffff" arch="x86_64" vendor="AuthenticAMD" familyid="25" '
                   f'modelid="1">')
        end = ngpus * (c + 1) // 2
        while g < end:
            sw = g // per_switch
            out.append(f'    <pci busid="{c:04x}:{sw:02x}:00.0" class="0x060400" vendor="0x1000" device="0xc010" '
                       f'subsystem_vendor="0x0" subsystem_device="0x0" link_speed="32.0 GT/s PCIe" link_width="16">')
            for k in range(per_switch):
                if g >= end:
                    break
                out.append(f'      <pci busid="{c:04x}:{sw:02x}:{k + 1:02x}.0" class="0x030200" vendor="0x10de" '
                           f'device="0x2330" subsystem_vendor="0x10de" subsystem_device="0x16c1" '
                           f'link_speed="32.0 GT/s PCIe" link_width="16">')
                out.append(f'        <gpu dev="{g}" sm="{sm}" rank="{g}" gdr="1">')
                if nvswitch:
                    out.append('          <nvlink target="fffffff:ffff:ff" count="18" tclass="0x068000"/>')
                out += ['        </gpu>', '      </pci>']
                g += 1
            out.append('    </pci>')
        out.append('  </cpu>')
    return "\n".join(out + ['</system>']) + "\n"


def test_a_bad_nvlink_target_is_one_line(tmp_path, call):
    """GPU 0's NVLink to GPU 1 points at a bus id no GPU has: GPU 1's link back has no partner, which NCCL's
    ncclTopoSetPaths reports as 'Failed to find reverse path'."""
    text = (ROOT / "topologies" / "dgx1-like.xml").read_text()
    bad = tmp_path / "bad.xml"
    bad.write_text(text.replace('target="0000:07:00.0" count="1"', 'target="0000:77:00.0" count="1"', 1))
    one_line_error(cli("collectives.tools.topology", str(bad)), "reverse")
    one_line_error(call("collectives.tools.tune", "--topo", str(bad), "-b", "1M", "-e", "1M"), "reverse")
    notbus = tmp_path / "notbus.xml"
    notbus.write_text(text.replace('target="0000:07:00.0" count="1"', 'target="zz:07" count="1"', 1))
    one_line_error(call("collectives.tools.topology", str(notbus)), "not a PCI bus id")
    one_line_error(call("collectives.tools.tune", "--topo", str(notbus), "-b", "1M", "-e", "1M"), "not a PCI bus id")


def test_sixty_four_gpus_search_without_recursion_error(tmp_path):
    """The search recursed once per GPU per channel in Python (a RecursionError from 64 GPUs); it is iterative."""
    xml = tmp_path / "g64.xml"
    xml.write_text(topo_xml(64))
    proc = cli("collectives.tools.topology", str(xml), "--brief", timeout=240)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.search(r"# ring graph: RING, \d+ channels", proc.stdout)
    assert "[63] NCCL INFO Trees" in proc.stdout


def test_nccl_xml_node_limit_refuses_ten_thousand_gpus_at_once(tmp_path, call):
    """NCCL's parser holds NCCL_TOPO_XML_MAX_NODES (256) nodes and fails past them; 10,000 GPUs never ended."""
    xml = tmp_path / "g10k.xml"
    xml.write_text(topo_xml(10_000))
    one_line_error(cli("collectives.tools.topology", str(xml), timeout=60), "256")
    one_line_error(call("collectives.tools.tune", "--topo", str(xml)), "256")
    one_line_error(call("visualize", "topo", str(xml), "-o", str(tmp_path / "m")), "256")


def test_xml_beyond_what_ncclS_parser_can_hold_is_refused_by_size(tmp_path, call):
    xml = tmp_path / "big.xml"
    with open(xml, "w") as f:
        f.write(topo_xml(8).replace("</system>", ""))
        f.write(("<!-- " + "x" * 1000 + " -->\n") * 6000)
        f.write("</system>\n")
    one_line_error(call("collectives.tools.topology", str(xml)), "MiB")


def test_no_user_file_is_unpickled():
    """Nothing reads a user's file with pickle (or np.load with allow_pickle): a crafted file must never run
    code or raise UnpicklingError.  A static check over every module of ours."""
    bad = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in (".venv", "tests", "build") or "egg-info" in rel.parts[0]:
            continue
        text = path.read_text(errors="replace")
        for pat in (r"\bimport pickle\b", r"\bpickle\.load", r"allow_pickle\s*=\s*True", r"\bnp\.load\([^)]*pickle",
                    r"\bshelve\b", r"\bmarshal\.load", r"torch\.load\("):
            if re.search(pat, text):
                bad.append(f"{rel}: {pat}")
    assert not bad, bad


# --- 4. costs: linear in time, bounded in memory -----------------------------------------------------------------
PROBE = r"""
import importlib, json, resource, sys, time
mod, fn = sys.argv[1].rsplit(":", 1)
main = getattr(importlib.import_module(mod), fn)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
try:
    rc = main(sys.argv[3:])
except SystemExit as e:
    rc = e.code
dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
open(sys.argv[2], "w").write(json.dumps({"rc": rc, "s": dt, "base_kb": base, "peak_kb": peak}))
"""


def probe(tmp_path: Path, entry: str, *args: str, timeout: float = 300) -> dict:
    out = tmp_path / "probe.json"
    proc = subprocess.run([PY, "-c", PROBE, entry, str(out), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)
    assert out.exists(), proc.stderr[-3000:]
    return json.loads(out.read_text())


def repeat_to(path: Path, src: str, size: int) -> Path:
    with open(path, "w") as f:
        written = 0
        while written < size:
            f.write(src)
            written += len(src)
    return path


def scaling(tmp_path: Path, entry: str, src: str, args, mb: float = 5) -> tuple[dict, dict]:
    """Run ``entry`` on 1x and 4x ``mb`` MB of ``src`` repeated: time ratio below 6 (linear: 4), and memory that
    does not grow with the input (growth under a quarter of the added bytes; holding the text costs several x)."""
    small = repeat_to(tmp_path / "small.in", src, int(mb * 1e6))
    big = repeat_to(tmp_path / "big.in", src, int(4 * mb * 1e6))
    one = probe(tmp_path, entry, *args(small))
    four = probe(tmp_path, entry, *args(big))
    grew_kb = four["peak_kb"] - one["peak_kb"]
    added_kb = (big.stat().st_size - small.stat().st_size) / 1024
    assert grew_kb < added_kb / 4, (one, four)
    assert four["s"] / max(one["s"], 0.05) < 6, (one, four)
    return one, four


def test_explain_is_linear_and_bounded(tmp_path):
    one, four = scaling(tmp_path, "tracing.__main__:main", H100.read_text(),
                        lambda p: ["explain", str(p), "-o", str(tmp_path / "x")])
    assert one["rc"] == four["rc"] == 0


def test_from_log_is_linear_and_bounded(tmp_path):
    one, four = scaling(tmp_path, "collectives.graph.replay:main", H100.read_text(), lambda p: [str(p)])
    assert one["rc"] == four["rc"] == 0


def test_curves_is_linear_and_bounded(tmp_path):
    """nccl-tests output with NCCL_DEBUG=INFO: mostly INFO lines, then the table (our 2.18-format data file)."""
    info = "".join(ln + "\n" for ln in H100.read_text().splitlines() if " NCCL INFO " in ln)
    table = (DATA / "all_reduce_perf_218.txt").read_text()
    small = repeat_to(tmp_path / "small.txt", info, 5_000_000)
    big = repeat_to(tmp_path / "big.txt", info, 20_000_000)
    for p in (small, big):
        with open(p, "a") as f:
            f.write(table)
    one = probe(tmp_path, "visualize.__main__:main", "curves", str(small), "-o", str(tmp_path / "s.png"))
    four = probe(tmp_path, "visualize.__main__:main", "curves", str(big), "-o", str(tmp_path / "b.png"))
    assert one["rc"] == four["rc"] == 0, (one, four)
    assert four["peak_kb"] - one["peak_kb"] < 15_000 / 4 * 1000 / 1024, (one, four)
    assert four["s"] / max(one["s"], 0.05) < 6, (one, four)


def test_nccl_tests_rows_of_many_processes_are_linear():
    """Rows whose size restarts open another table alongside; there were as many open tables as restarts, each
    scanned per row (quadratic: 4 MB took 11x the time of 1 MB)."""
    import time

    from visualize import nccl_tests
    rows = "".join(ln + "\n" for ln in (DATA / "all_reduce_perf_218.txt").read_text().splitlines()
                   if ln.strip() and not ln.lstrip().startswith("#"))
    times = []
    for mb in (1, 4):
        text = rows * int(mb * 1e6 / len(rows))
        best = float("inf")
        for _ in range(3):  # the best of three: a burst of another process on the 2 cores is not the parser's cost
            t = time.perf_counter()
            tables = nccl_tests.parse(text)
            best = min(best, time.perf_counter() - t)
        times.append(best)
        assert len(tables) > 10
    assert times[1] / max(times[0], 0.01) < 9, times  # linear: 4; the quadratic parser measured 11-16


def test_topo_refuses_a_big_file_fast_and_small(tmp_path):
    xml = tmp_path / "big.xml"
    with open(xml, "w") as f:
        f.write(topo_xml(8).replace("</system>", "") + ("<!-- " + "y" * 10_000 + " -->\n") * 20_000 + "</system>\n")
    r = probe(tmp_path, "collectives.tools.topology:main", str(xml))
    assert r["rc"] == 2 and r["s"] < 5 and r["peak_kb"] - r["base_kb"] < 50_000, r
