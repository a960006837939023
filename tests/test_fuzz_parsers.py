"""Fuzzing the parsers of user files: random bytes, random lines in each grammar, and truncations and mutations of
every real input (``tests/data``, ``topologies/`` and, when present, the shared fixtures), fed to

* the NCCL log parser (``tracing.nccl_log``, strict and lenient) and what ``explain`` builds on it
  (``tracing.log_facts``'s facts, unusual lines and report, ``collectives.graph.replay``, the diagrams' DOT sources);
* the nccl-tests output parser (``visualize.nccl_tests``);
* the topology XML loader (``collectives.graph.topo_xml``) and the system built from it (``topo.py``, the paths of
  ``paths.py``).

The only outcomes allowed are a result or the parser's own one-line error (``LogError``, ``OutputError``,
``TopoError``); anything else fails, naming the case and keeping its input under the test's tmp_path.  Plain
``random`` with fixed seeds: every run feeds the same cases.
"""
import random
import re
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT
from tracing.nccl_log import LogError

DATA = ROOT / "tests" / "data"


def real_files() -> list[Path]:
    files = sorted(p for p in DATA.iterdir() if p.is_file() and p.suffix != ".md")
    files += sorted((ROOT / "topologies").glob("*.xml"))
    if FIXTURES.is_dir():
        files += sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.suffix != ".md")
    return files


REAL = {p.name: p.read_bytes() for p in real_files()}
NUMS = ["0", "1", "2", "7", "15", "16", "-1", "-2", "-3", "99", "4095", "1048576", "4294967296",
        "99999999999999999999", "0x10", "", "x", "1.5", "-0", "٣"]


def rnum(rng: random.Random) -> str:
    return str(rng.randrange(-3, 20)) if rng.random() < 0.85 else rng.choice(NUMS)


def random_bytes(rng: random.Random) -> bytes:
    return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 600)))


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to four edits: cut, drop a span, repeat or swap lines, change a number, insert bytes, flip one."""
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(7)
        n = len(data)
        if kind == 0 and n:
            data = data[:rng.randrange(n)]
        elif kind == 1 and n:
            a = rng.randrange(n)
            data = data[:a] + data[a + rng.randrange(1, 200):]
        elif kind in (2, 3):
            lines = data.split(b"\n")
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            if kind == 2:
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            data = b"\n".join(lines)
        elif kind == 4:
            nums = list(re.finditer(rb"-?\d+", data))
            if nums:
                m = rng.choice(nums)
                data = data[:m.start()] + rnum(rng).encode() + data[m.end():]
        elif kind == 5:
            a = rng.randrange(n + 1)
            data = data[:a] + random_bytes(rng)[:rng.randrange(1, 40)] + data[a:]
        elif n:
            a = rng.randrange(n)
            data = data[:a] + bytes([rng.randrange(256)]) + data[a + 1:]
    return data


# --- NCCL logs ------------------------------------------------------------------------------------------------
def log_line(rng: random.Random) -> str:
    host, pid = rng.choice(["h0", "h1", "node-a", "lccn09"]), rng.choice([1, 2, 3, 40])
    head = rng.choice([f"{host}:{pid}:{pid} [{rng.randrange(8)}] NCCL INFO ", "NCCL INFO ", "[1] NCCL INFO ",
                       f"0: {host}:{pid}:7 [0] NCCL INFO ", f"[default0]:{host}:{pid}:7 [0] NCCL INFO ", "",
                       f"{host}:{pid}:{pid} [0] init.cc:12 NCCL WARN ", "text NCCL INFO "])
    r = lambda: rnum(rng)  # noqa: E731
    ch = rng.choice([0, 1, 2, 3, 15, 63, 64, 99])
    body = rng.choice([
        lambda: f"comm 0x{rng.randrange(4):x} rank {r()} nRanks {r()} nNodes {r()} localRanks {r()} "
                f"localRank {r()} MNNVL 0",
        lambda: f"comm 0x{rng.randrange(4):x} rank {r()} nranks {r()} cudaDev 0 nvmlDev 0 busId 0 "
                f"commId 0x{rng.randrange(3):x} - Init COMPLETE",
        lambda: f"Channel {ch:02d}/{rng.choice([1, 2, 16, 64, 65]):02d} :" + "".join(
            f" {r()}" for _ in range(rng.randrange(0, 9))) + rng.choice(["", " ..."]),
        lambda: "Trees" + "".join(f" [{rng.choice([c, ch])}] {r()}/{r()}/{r()}->{r()}->{r()}"
                                  for c in range(rng.randrange(0, 5))) + rng.choice(["", " [3] 1/", " junk"]),
        lambda: f"Channel {ch:02d}/0 : {r()}[0] -> {r()}[1] " + rng.choice(["[send] ", "[receive] ", ""])
                + rng.choice(["via P2P/IPC", "via NET/IB/0", "via SHM/direct/direct", "via"]),
        lambda: f"Pattern {rng.choice([1, 2, 3, 4, 5, 9])}, crossNic 0, nChannels {r()}, bw 20.000000/20.000000, "
                f"type NVL/PIX, sameChannels 1",
        lambda: f" {rng.randrange(4)} : NET/0 " + " ".join(f"GPU/{r()}" for _ in range(rng.randrange(4)))
                + rng.choice([" NET/0", " GPU/x", ""]),
        lambda: rng.choice(["NCCL version 2.19.3+cuda12.2", "NCCL version", "NCCL version 2.30.0"]),
        lambda: f"{r()} coll channels, 0 collnet channels, 0 nvls channels, 16 p2p channels",
        lambda: f"{rng.choice(['AllReduce', 'Broadcast', 'x'])}: {r()} Bytes -> Algo RING proto SIMPLE "
                f"channel{{Lo..Hi}}={{0..1}}",
        lambda: "Algorithm   |  Tree | Ring",
        lambda: "".join(rng.choice("NCCL INFO Trees[]/->0123456789 :x\t") for _ in range(rng.randrange(60))),
    ])()
    return head + body


def log_inputs(rng: random.Random, n: int):
    reals = list(REAL.items())
    for i in range(n):
        kind = i % 4
        if kind == 0:
            yield "bytes", random_bytes(rng).decode("utf-8", "replace")
        elif kind == 1:
            yield "lines", "\n".join(log_line(rng) for _ in range(rng.randrange(1, 40))) + "\n"
        else:
            name, data = rng.choice(reals)
            yield name, mutate(rng, data).decode("utf-8", "replace")


def explain_pipeline(text: str) -> None:
    """Everything ``python -m tracing explain`` and ``visualize log`` compute, but rendering."""
    from collectives.graph.replay import nodes_of, replay_log
    from tracing import log_facts, nccl_log
    from visualize import explain as visualize_explain
    for strict in (True, False):
        try:
            nccl_log.parse(text, strict=strict)
        except LogError:
            assert strict
    try:
        nccl_log.parse(text, comm="0")
    except LogError:
        pass
    facts = log_facts.read(text)
    log_facts.is_nccl_log(facts)
    log_facts.unusual(facts)
    n = log_facts.nranks(facts)
    node_of = nodes_of(facts.log, n) if n else []
    log_facts.report(facts, "fuzz", node_of)
    try:
        rep = replay_log(facts.log)
    except LogError:
        rep = None
    visualize_explain.sources(facts, "fuzz", replayed=rep)


def run_cases(cases, pipeline, allowed, tmp_path: Path) -> int:
    done = 0
    for i, (source, data) in enumerate(cases):
        try:
            pipeline(data)
        except allowed as exc:
            assert "\n" not in str(exc).strip(), f"case {i} ({source}): a multi-line error: {exc!r}"
        except Exception as exc:  # noqa: BLE001 - any other exception is the failure this suite looks for
            keep = tmp_path / f"case{i}.in"
            keep.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "replace"))
            raise AssertionError(f"case {i} (from {source}, kept in {keep}): {type(exc).__name__}: {exc}") from exc
        done += 1
    return done


def test_nccl_log_parser_and_explain(tmp_path):
    assert run_cases(log_inputs(random.Random(2401), 2000), explain_pipeline, LogError, tmp_path) == 2000


# --- nccl-tests output ----------------------------------------------------------------------------------------
TOKENS = ["N/A", "0", "1.5", "...", "1e5", "-", "nan", "inf", "12", "0e+00", "x", "-1", "٣"]


def nccl_tests_line(rng: random.Random) -> str:
    tok = lambda: rng.choice(TOKENS)  # noqa: E731
    size = rng.choice([8, 16, 1024, 1 << 20, 7, 0])
    row = [str(size), str(size // 4), "float", "sum", *([tok()] if rng.random() < 0.5 else [])] + [
        tok() for _ in range(8)]
    line = rng.choice([
        lambda: "  ".join(row),
        lambda: f"# Avg bus bandwidth    : {tok()}",
        lambda: f"# Out of bounds values : {rng.randrange(5)} {rng.choice(['OK', 'FAILED'])}",
        lambda: f"#  Rank {rng.randrange(4)} Group  0 Pid {rng.randrange(99)} on host{rng.randrange(3)} device 0",
        lambda: "#       size         count      type   redop    root     time   algbw   busbw #wrong",
        lambda: "h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2",
        lambda: "".join(rng.choice("# 0123456789.eN/A:\t") for _ in range(rng.randrange(60))),
    ])()
    return rng.choice(["", "0: ", "[1,0]<stdout>:", "[0] "]) + line


def test_nccl_tests_parser(tmp_path):
    from visualize import nccl_tests

    def cases():
        rng = random.Random(2402)
        reals = list(REAL.items())
        for i in range(2000):
            kind = i % 4
            if kind == 0:
                yield "bytes", random_bytes(rng).decode("utf-8", "replace")
            elif kind == 1:
                yield "lines", "\n".join(nccl_tests_line(rng) for _ in range(rng.randrange(1, 60)))
            else:
                name, data = rng.choice(reals)
                yield name, mutate(rng, data).decode("utf-8", "replace")

    def pipeline(text: str) -> None:
        for t in nccl_tests.parse(text):
            t.shape
            [(r.size, r.out_of_place["busbw"], r.in_place["algbw"]) for r in t.rows]
    assert run_cases(cases(), pipeline, nccl_tests.OutputError, tmp_path) == 2000


# --- topology XML ---------------------------------------------------------------------------------------------
BUSIDS = ["0000:10:00.0", "0000:11:00.0", "0000:12:00.0", "0000:20:00.0", "fffffff:ffff:ff", "zz", "", "0:0"]
ATTRS = {
    "system": {"version": ["1"] * 8 + ["2", "x"], "name": ["fuzz"]},
    "cpu": {"numaid": ["0", "1", "-1", "x"], "arch": ["x86_64", "arm64", "ppc64", "?"],
            "vendor": ["GenuineIntel", "AuthenticAMD", "CentaurHauls", "x"], "familyid": ["6", "25", "x"],
            "modelid": ["85", "143", "207", "1"], "affinity": ["ffff"]},
    "pci": {"busid": BUSIDS, "class": ["0x060400", "0x030200", "0x020700", "0x068000", "0x068001", "0x080100",
                                      "x"],
            "link_speed": ["16.0 GT/s PCIe", "32.0 GT/s PCIe", "?"], "link_width": ["16", "0", "x16", "-1"],
            "vendor": ["0x1000", "0x10de", "x"], "device": ["0xc010", "0x2330"],
            "subsystem_vendor": ["0x1000"], "subsystem_device": ["0xa000", "0x0"]},
    "gpu": {"dev": ["0", "1", "7", "-1"], "sm": ["70", "80", "90", "100", "x", "0"], "rank": ["0", "1", "2", "x"],
            "gdr": ["0", "1"]},
    "nvlink": {"target": BUSIDS, "count": ["1", "2", "18", "0", "-4", "x"],
               "tclass": ["0x030200", "0x068000", "0x068001", "x"]},
    "c2c": {"bw": ["1000", "x"], "count": ["1", "10"]},
    "pcilink": {"target": BUSIDS},
    "nic": {},
    "net": {"name": ["mlx5_0"], "dev": ["0", "1", "x"], "speed": ["400000", "0", "x"], "latency": ["0", "x"],
            "port": ["1"], "guid": ["0x1", "zz"], "maxconn": ["65536"], "gdr": ["0", "1"], "net": ["1", "0"],
            "coll": ["0", "1"]},
}
CHILDREN = {"system": ["cpu"], "cpu": ["pci", "pci", "nic"], "pci": ["pci", "gpu", "gpu", "gpu", "nic", "pcilink"],
            "gpu": ["nvlink", "c2c"], "nic": ["net"]}


def xml_node(rng: random.Random, tag: str, depth: int) -> str:
    """A random element: each attribute's first value (valid) mostly, another now and then, or none."""
    def value(pool: list) -> str | None:
        x = rng.random()
        return None if x < 0.01 else pool[0] if x < 0.85 else rng.choice(pool) if x < 0.98 else rnum(rng)
    picks = {k: value(v) for k, v in ATTRS.get(tag, {}).items()}
    if tag == "pci" and picks.get("busid") == BUSIDS[0]:
        picks["busid"] = f"0000:{rng.randrange(256):02x}:00.{rng.randrange(8)}"   # distinct bus ids, mostly
    if tag in ("nvlink", "pcilink") and rng.random() < 0.5:
        picks["target"] = f"0000:{rng.randrange(256):02x}:00.{rng.randrange(8)}"
    if tag == "gpu" and picks.get("rank") == "0":
        picks["rank"] = str(rng.randrange(8))
    attrs = " ".join(f'{k}="{v}"' for k, v in picks.items() if v is not None)
    kids = "".join(xml_node(rng, rng.choice(CHILDREN[tag]), depth + 1)
                   for _ in range(rng.randrange(0, 4) if tag in CHILDREN and depth < 4 else 0))
    if rng.random() < 0.05:
        kids += "<unknown a='1'><gpu/></unknown>"
    return f"<{tag} {attrs}>{kids}</{tag}>" if kids else f"<{tag} {attrs}/>"


def mutate_xml(rng: random.Random, data: bytes) -> bytes:
    """Edits that keep the XML well-formed, so the cases reach the system and its paths: change or drop an
    attribute, repeat, drop or swap elements that sit on one line."""
    text = data.decode("utf-8", "replace")
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(4)
        attrs = list(re.finditer(r'(\w+)="([^"]*)"', text))
        lines = text.split("\n")
        whole = [i for i, ln in enumerate(lines) if re.match(r"\s*<\w[^>]*/>\s*$", ln)]
        if kind == 0 and attrs:
            m = rng.choice(attrs)
            pool = [v for tag in ATTRS.values() for v in tag.get(m.group(1), [])] + [rnum(rng), m.group(2)[::-1]]
            text = text[:m.start(2)] + rng.choice(pool) + text[m.end(2):]
        elif kind == 1 and attrs:
            m = rng.choice(attrs)
            text = text[:m.start()] + text[m.end():]
        elif kind == 2 and whole:
            i = rng.choice(whole)
            if rng.random() < 0.5:
                lines.insert(rng.choice(whole), lines[i])
            else:
                del lines[i]
            text = "\n".join(lines)
        elif whole:
            i, j = rng.choice(whole), rng.choice(whole)
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
    return text.encode()


def topo_pipeline(path: str) -> None:
    from collectives.graph.paths import compute_paths, print_paths, search_init, trim_system
    from collectives.graph.topo import print_system, system_from_xml
    from collectives.graph.topo_xml import StandIns, dump_xml, fused_xml, gpu_pcis, load_xml
    xml = load_xml(path)
    n = len(gpu_pcis(xml))
    for stand in (StandIns(sm=90), StandIns(sm=80, nvlinks=0, nics=False)):
        fused = fused_xml(xml, n, stand)
        dump_xml(fused)
        system = system_from_xml(fused)
        compute_paths(system)
        trim_system(system, 0, n)
        compute_paths(system)
        search_init(system)
        print_system(system)
        print_paths(system)


def test_topology_xml_loader_and_system(tmp_path):
    from collectives.graph.topo_xml import TopoError
    xmls = [(k, v) for k, v in REAL.items() if k.endswith(".xml")]

    def cases():
        rng = random.Random(2403)
        for i in range(1200):
            kind = i % 10
            if kind == 0:
                data = random_bytes(rng)
            elif kind < 4:
                data = xml_node(rng, "system", 0).encode()
            elif kind < 8:
                data = mutate_xml(rng, rng.choice(xmls)[1])
            else:
                data = mutate(rng, rng.choice(list(REAL.items()))[1])
            path = tmp_path / "in.xml"
            path.write_bytes(data)
            yield f"kind {kind}", str(path)

    def pipeline(path: str) -> None:
        topo_pipeline(path)
    assert run_cases(cases(), pipeline, TopoError, tmp_path) == 1200


@pytest.mark.parametrize("name", sorted(k for k in REAL if k.endswith(".xml")))
def test_every_real_topology_goes_through_unchanged(name):
    """The fuzz pipeline itself runs clean on the real files."""
    path = next(p for p in real_files() if p.name == name)
    topo_pipeline(str(path))
