"""Graph files (NCCL_GRAPH_FILE, the XML NCCL_GRAPH_DUMP_FILE writes) for the tests."""


def graph_file(path, ring: list, tree: list | None = None, tree_pattern: int = 1, nets: bool = False,
               ranks: bool = False) -> str:
    """A graph file of a ring graph (id 0) and a tree graph (id 1), one channel per device list."""
    def channel(devs):
        net = '<net dev="0"/>' if nets else ""
        gpus = "".join(f'<gpu dev="{d:#x}"' + (f' rank="{d}"' if ranks else "") + "/>" for d in devs)
        return f"<channel>{net}{gpus}{net}</channel>"

    def graph(gid, pattern, chans):
        return (f'<graph id="{gid}" pattern="{pattern}" crossnic="0" nchannels="{len(chans)}" speedintra="6" '
                f'speedinter="6" latencyinter="0" typeintra="PHB" typeinter="PHB" samechannels="1">'
                + "".join(channel(c) for c in chans) + "</graph>")
    path.write_text(f'<graphs version="1">{graph(0, 4, ring)}{graph(1, tree_pattern, tree or ring)}</graphs>')
    return str(path)
