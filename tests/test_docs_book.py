"""The book (docs/README.md and its chapters) against the code: ``scripts/make_docs.py --fast`` runs every
chapter's commands at small sizes into a temporary folder, and fails when a command no longer runs, an output or
picture a chapter shows is not produced, or a fact a chapter states (a channel count, a threshold, a busbw
factor, the culprit of a hang) is no longer true of the output.  Plus the book's order and the chunk-flow
layout (issue 28: the arrow from rank 1 to rank 2 once detoured past rank 3)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import make_docs  # noqa: E402


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_docs.py"), "--fast", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=240)
    return proc, out


def test_fast_mode_runs_every_command_and_every_fact_holds(fast):
    proc, _ = fast
    assert proc.returncode == 0, proc.stderr
    assert "0 problem(s)" in proc.stdout


def test_every_chapter_got_its_outputs_and_facts(fast):
    _, out = fast
    for ch in make_docs.CHAPTERS:
        text = (out / ch.doc).read_text()
        for s in ch.steps:
            if s.py or s.only_full:
                continue
            block = re.search(rf"<!-- output: {s.name} -->\n```console\n\$ (.*?)\n```\n<!-- end -->", text, re.S)
            assert block, f"{ch.doc}: output {s.name} not filled in"
        facts = re.search(r"<!-- facts -->\n(.*?)<!-- end -->", text, re.S).group(1)
        assert facts.count("\n* ") + facts.startswith("* ") == sum(not f.only_full for f in ch.facts), ch.doc


def test_the_chunk_flow_arrows_go_straight_to_the_ring_neighbour(fast):
    _, out = fast
    ok, detail = make_docs.straight_ring_arrows(make_docs.Run(out, True), "chunk-flow.dot")
    assert ok, detail
    assert "30 of 30" in detail  # 4 ranks: 6 sends each, 24 in-order arrows and 6 wrap-arounds as stubs


def test_a_broken_fact_is_reported_in_one_line(tmp_path):
    """A fact that no longer holds (here: a claimed factor of 2 for AllReduce) is one line naming the chapter."""
    run = make_docs.Run(tmp_path, True)
    (tmp_path / "ring.json").write_text(json.dumps([{"algbw": 1.0, "busbw": 1.5}]))
    ch = make_docs.Chapter("x.md", [], {}, [make_docs.Fact("AllReduce factor 2", lambda r: (
        make_docs.ratio_rows(r, "ring.json") == {2.0}, str(make_docs.ratio_rows(r, "ring.json"))))])
    problems = []
    make_docs.check_facts(ch, run, problems)
    assert problems == ["x.md: fact no longer true: AllReduce factor 2 (measured: {1.5})"]


def test_the_reading_path_lists_every_chapter_in_order():
    index = (ROOT / "docs" / "README.md").read_text()
    links = re.findall(r"\]\(([\w./-]+\.md)\)", index)
    chapters = [c.doc for c in make_docs.CHAPTERS if re.match(r"\d\d-", c.doc)]
    assert [x for x in links if re.match(r"\d\d-", x)] == chapters
    assert "trees.md" in links and "topology-search.md" in links
    assert "[docs/README.md](docs/README.md)" in (ROOT / "README.md").read_text().split("\n## ", 1)[0]  # the top
    for c in make_docs.CHAPTERS:
        for pic in c.pictures.values():
            assert (ROOT / "docs" / pic).stat().st_size < make_docs.PICTURE_MAX, pic
