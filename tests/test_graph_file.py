"""NCCL_GRAPH_FILE and NCCL_GRAPH_DUMP_FILE (NCCL ``search.cc``: ``ncclTopoGetGraphFromXml``,
``ncclTopoGetXmlFromGraphs``): the graphs NCCL dumps, read back by every rank in place of its search."""
import subprocess
import sys

import pytest

from collectives.graph import graph_xml
from collectives.graph.init_topo import run_topology
from collectives.graph.search import Graph
from collectives.graph.topo_xml import StandIns, TopoError
from conftest import ROOT
from graph_files import graph_file
from test_init_rank import ENV, comm_lines, run
from test_topo_lab import square


def test_graphs_xml_is_nccls_layout_and_reads_back(tmp_path):
    r = run_topology(str(square(tmp_path)), stand=StandIns(nics=False))
    text = graph_xml.graphs_xml([r.ring, r.tree, graph_xml.unsearched(4, 6)], {i: i for i in range(4)}, False)
    lines = text.splitlines()
    assert lines[0] == '<graphs version="1">'
    assert lines[1] == (f'  <graph id="0" pattern="4" crossnic="0" nchannels="{r.ring.n_channels}" speedintra='
                        f'"{r.ring.bw_intra:g}" speedinter="{r.ring.bw_inter:g}" latencyinter="0" typeintra="NVL" '
                        f'typeinter="{("LOC", "NVL", "NVB", "C2C", "PIX")[r.ring.type_inter]}" samechannels="'
                        f'{r.ring.same_channels}">')
    assert lines[2:4] == ["    <channel>", '      <gpu dev="0" rank="0"/>']
    assert lines[4] == f'      <gpu dev="{r.ring.intra[0][1]:#x}" rank="{r.ring.intra[0][1]}"/>'
    assert '<graph id="4" pattern="6" crossnic="0" nchannels="0" speedintra="0" speedinter="0" latencyinter="0" ' \
           'typeintra="LOC" typeinter="LOC" samechannels="0"/>' in text
    path = tmp_path / "g.xml"
    path.write_text(text)
    root = graph_xml.load_graphs(str(path))
    for want in (r.ring, r.tree):
        g = Graph(id=want.id, pattern=0)
        assert graph_xml.graph_from_xml(root, g, {i: i for i in range(4)}, [0, 1, 2, 3]) == want.n_channels
        assert g.channels() == want.channels() and g.pattern == want.pattern
        assert (g.bw_intra, g.type_intra, g.same_channels) == (want.bw_intra, want.type_intra, want.same_channels)


def test_graph_file_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text('<graphs version="2"></graphs>')
    with pytest.raises(TopoError, match="wrong version 2, 1 needed"):
        graph_xml.load_graphs(str(bad))
    g = Graph(id=0, pattern=0)
    with pytest.raises(TopoError, match="not a rank of this node"):
        graph_xml.graph_from_xml(graph_xml.load_graphs(graph_file(bad, [[0, 1]], ranks=True)), g, {0: 2, 1: 3},
                                 [2, 3])
    with pytest.raises(TopoError, match="dev 5 not found"):
        graph_xml.graph_from_xml(graph_xml.load_graphs(graph_file(bad, [[0, 5]])), g, {0: 0, 1: 1}, [0, 1])


def test_dumped_graphs_replace_the_search(tmp_path):
    """NCCL_GRAPH_DUMP_FILE from a --topo run; NCCL_GRAPH_FILE with that file and no topology gives the same
    rings and trees."""
    xml, dump = square(tmp_path), tmp_path / "graphs.xml"
    first = run("collectives.ring", ["-g", "4", "--topo", str(xml)], {**ENV, "NCCL_GRAPH_DUMP_FILE": str(dump)})
    assert dump.read_text().startswith('<graphs version="1">\n  <graph id="0" pattern="4"')
    again = run("collectives.ring", ["-g", "4"], {**ENV, "NCCL_GRAPH_FILE": str(dump)})
    log = again.stdout + again.stderr
    assert "Search 0 : " in log and "channels loaded from XML graph" in log
    assert comm_lines(log) == comm_lines(first.stdout + first.stderr)


def test_graph_file_by_device_on_two_nodes(tmp_path):
    """GPUs named by dev: each node maps them to its own ranks; channel 1's reversed order gives ring 0 3 2 1."""
    path = graph_file(tmp_path / "g.xml", [[0, 1], [1, 0]], nets=True)
    proc = run("collectives.tree", ["-g", "4", "--nodes", "2"], {**ENV, "NCCL_GRAPH_FILE": path})
    got = comm_lines(proc.stdout + proc.stderr)
    assert got["Channel"] == ["Channel 00/04 : 0 1 2 3", "Channel 01/04 : 0 3 2 1", "Channel 02/04 : 0 1 2 3",
                              "Channel 03/04 : 0 3 2 1"]


def test_bad_graph_file_ends_every_rank_with_one_line(tmp_path):
    path = graph_file(tmp_path / "g.xml", [[0, 1]])
    path_text = (tmp_path / "g.xml").read_text().replace('typeintra="PHB"', 'typeintra="FOO"', 1)
    (tmp_path / "g.xml").write_text(path_text)
    proc = subprocess.run([sys.executable, "-m", "collectives.ring", "-g", "2", "-b", "8", "-e", "8"],
                          env={**ENV, "NCCL_GRAPH_FILE": path}, capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode != 0
    assert proc.stderr.count("typeintra='FOO'") == 2, proc.stderr[-2000:]
