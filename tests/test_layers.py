"""Imports only point down: the packages form floors (NCCL's ``src/misc`` and ``src/include`` at the bottom, under
``tracing`` alone; then the transports, the device code and the graph code, then the communicator, then the
nccl-tests runner, the command-line tools and the pictures), and no import of ours, at module level or inside a
function, goes from a floor to one that imports it back.  Inside a floor, no two files import each other, directly
or through others.  Program entry points (``__main__.py``, and ``collectives/ring.py`` and ``tree.py``, which
``python -m collectives.ring`` needs at the package's root) are the top of the stack and may import anything."""
import ast
from pathlib import Path

from conftest import ROOT

LIBRARY = ("collectives", "transports", "tracing", "visualize")
# The floors, bottom up; a floor may import only the floors before it (those of one tuple sit side by side).
FLOOR_ORDER = (("tracing",), ("collectives.misc",), ("collectives.include",), ("transports",),
               ("collectives.device", "collectives.graph"), ("collectives",), ("collectives.perf",),
               ("collectives.tools",), ("visualize",))
FLOORS = sorted((f for level in FLOOR_ORDER for f in level), key=len, reverse=True)  # the longest prefix wins
LEVEL = {f: i for i, level in enumerate(FLOOR_ORDER) for f in level}
ENTRY_POINTS = {"collectives.ring", "collectives.tree", "collectives.sendrecv", "collectives.alltoall",
                "collectives.gather", "collectives.scatter"}


def floor_of(module: str) -> str | None:
    return next((f for f in FLOORS if module == f or module.startswith(f + ".")), None)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of ours but the entry points: module name -> file."""
    files = {}
    for top in LIBRARY:
        for path in sorted((root / top).rglob("*.py")):
            name = module_name(path, root)
            if path.name != "__main__.py" and name not in ENTRY_POINTS:
                files[name] = path
    return files


def imported(path: Path, root: Path = ROOT) -> list[tuple[str, list[str]]]:
    """(module, names taken from it) for every import statement in ``path``, wherever it is."""
    mod = module_name(path, root)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((target, [a.name for a in node.names]))
    return found


def imports_of(path: Path) -> set[str]:
    """Every module of ours that ``path`` imports ("from pkg import name" counts both pkg and pkg.name)."""
    found = set()
    for target, names in imported(path):
        found |= {target} | {f"{target}.{n}" for n in names}
    return {m for m in found if floor_of(m)}


def floor_graph() -> dict[str, dict[str, list[str]]]:
    """floor -> floor it imports -> the modules that do it."""
    graph: dict[str, dict[str, list[str]]] = {f: {} for f in FLOORS}
    for name, path in library_files().items():
        here = floor_of(name)
        for target in imports_of(path):
            there = floor_of(target)
            if there != here:
                graph[here].setdefault(there, []).append(name)
    return graph


def module_graph(root: Path = ROOT) -> dict[str, dict[str, list[str]]]:
    """module -> module of ours it imports -> the names it takes from it.  ``from pkg import sub`` is an import of
    the module ``pkg.sub`` (not of the package's face); ``import a.b`` is one of ``a.b``."""
    files = library_files(root)
    graph: dict[str, dict[str, list[str]]] = {m: {} for m in files}
    for name, path in files.items():
        for target, names in imported(path, root):
            for n in names or [None]:
                if n is not None and f"{target}.{n}" in files:
                    dest, what = f"{target}.{n}", f"(module {n})"
                else:
                    dest, what = target, n or "(import)"
                while dest and dest not in files:  # numpy.linalg -> numpy -> "": not ours
                    dest = dest.rpartition(".")[0]
                if dest and dest != name:
                    graph[name].setdefault(dest, []).append(what)
    return graph


def cycles(graph: dict) -> list[list[str]]:
    found, seen = [], set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in graph[node]:
            if nxt in path:
                cycle = path[path.index(nxt):] + [nxt]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    found.append(cycle)
            else:
                walk(nxt, path + [nxt])

    for start in graph:
        walk(start, [start])
    return found


def circles(graph: dict) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted: every file of a circle of
    imports, however many circles pass through it."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def describe_circles(graph: dict, found: list[list[str]], root: Path = ROOT) -> str:
    files = library_files(root)
    lines = []
    for component in found:
        paths = [str(files[m].relative_to(root)) for m in component]
        lines.append(f"circle of {len(component)} files: {', '.join(paths)}")
        for a in component:
            for b in component:
                if b in graph[a]:
                    lines.append(f"  {files[a].relative_to(root)} -> {files[b].relative_to(root)}: "
                                 f"{', '.join(sorted(set(graph[a][b])))}")
    return "\n".join(lines)


def test_no_import_cycle_between_floors():
    graph = floor_graph()
    found = cycles(graph)
    detail = [" -> ".join(c) + ": " + "; ".join(f"{a}->{b} in {sorted(set(graph[a][b]))}" for a, b in zip(c, c[1:]))
              for c in found]
    assert not found, "\n".join(detail)


def test_no_import_circle_between_files():
    graph = module_graph()
    found = circles(graph)
    assert not found, describe_circles(graph, found)


def test_every_import_points_down_the_floors():
    graph = floor_graph()
    up = [f"{a} (floor {LEVEL[a]}) imports {b} (floor {LEVEL[b]}): {sorted(set(graph[a][b]))}"
          for a in graph for b in graph[a] if LEVEL[b] > LEVEL[a]]
    assert not up, "\n".join(up)


def test_the_bottom_floors_import_only_below_them():
    graph = floor_graph()
    assert set(graph["tracing"]) == set(), graph["tracing"]
    assert set(graph["collectives.misc"]) <= {"tracing"}, graph["collectives.misc"]
    assert set(graph["collectives.include"]) <= {"tracing", "collectives.misc"}, graph["collectives.include"]


def test_the_checkers_see_a_cycle():
    assert cycles({"a": {"b": []}, "b": {"a": []}}) and not cycles({"a": {"b": []}, "b": {}})
    assert circles({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {"a": []}}) == [["a", "b", "c"]]
    assert not circles({"a": {"b": []}, "b": {}, "c": {"a": [], "b": []}})


def test_the_log_parser_bounds_channels_as_the_library_does():
    """``tracing.nccl_log`` sits below ``collectives.include`` and cannot import its ``MAXCHANNELS``: the two are one
    NCCL constant and must agree."""
    from collectives.include.device import MAXCHANNELS
    from tracing import nccl_log
    assert nccl_log.MAXCHANNELS == MAXCHANNELS
