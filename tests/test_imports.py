"""The project's imports, read from the source (tests/import_graph.py; nothing is imported, no model loads):
no Gradio below the UI, no cycles, dependencies pointing down, and docs/architecture.md's table in step."""

import pytest

from import_graph import DOC, WRITE_COMMAND, Graph, cycles, doc_table, read_graph, table

# What each top-level part may import of the project (docs/architecture.md, "Modules"): pruning stands
# alone, engine sits on pruning, the UI on the engine, and only the app chooses between the UI's engine
# and replicas. bench and train are imported by tests alone. evs is pruning's old name, kept for one
# release: it imports pruning, and nothing of the project imports it.
MAY_IMPORT = {
    "pruning": {"pruning"},
    "evs": {"evs", "pruning"},
    "engine": {"engine", "pruning"},
    "assets": {"assets", "engine"},
    "replicas": {"replicas", "engine", "pruning", "assets"},
    "ui": {"ui", "engine", "pruning", "assets"},
    "app": {"app", "ui", "replicas", "engine", "pruning", "assets"},
    "bench": {"bench", "replicas", "ui", "engine", "pruning", "assets"},
    "train": {"train", "engine", "pruning", "assets"},
}
GRADIO_FREE = ("engine", "pruning", "evs", "replicas")

# engine/'s rooms, lowest first, and the rooms each may import besides itself (docs/architecture.md, "engine/
# in rooms"). Every room may also import the vocabulary: the small modules at the top of engine/ that name
# what the rooms pass each other. Only engine/engine.py, prepare.py, __init__.py and __main__.py, at the top,
# import rooms freely; no room imports them.
VOCABULARY = {"engine.config", "engine.errors", "engine.stats", "engine.stream", "engine.lru", "engine.detokenize"}
ROOM_MAY_IMPORT = {
    "families": set(),
    "reading": set(),
    "state": set(),
    "front": set(),
    "checkpoints": {"families"},
    "loading": {"checkpoints", "families"},
    "prompt": {"families", "reading"},
    "live": {"families", "prompt", "reading"},
    "memory": {"checkpoints", "families", "prompt", "state"},
    "scheduling": {"families", "live", "prompt", "reading", "state"},
    "worker": {"families", "live", "prompt", "scheduling", "state"},
}
# Third-party packages a room never loads when it runs: reading runs inside the reader processes, which load
# a bare engine package without torch (seconds and hundreds of MB each); scheduling is bookkeeping over
# requests (it may name tensor types for annotations); the front door and the vocabulary are what every way in
# imports, a Ray client included.
NEVER_LOADS = {
    "reading": {"torch", "transformers"},
    "scheduling": {"torch", "transformers"},
    "front": {"torch", "transformers"},
    "vocabulary": {"torch", "transformers"},
}
MAX_FILES_PER_FOLDER = 12
MAX_LINES_PER_FILE = 450


@pytest.fixture(scope="module")
def graph() -> Graph:
    return read_graph()


def _top(module: str) -> str:
    return module.partition(".")[0]


def test_every_part_is_placed(graph):
    assert {_top(module) for module in graph.files} == set(MAY_IMPORT)


def test_no_gradio_below_the_ui(graph):
    offenders = sorted(
        module
        for module in graph.files
        if _top(module) in GRADIO_FREE and graph.external[module] & {"gradio", "gradio_client"}
    )
    assert not offenders, f"these modules import Gradio, which only ui/ and app.py may: {offenders}"


def test_no_import_cycles(graph):
    found = [" -> ".join(cycle) for cycle in cycles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_dependencies_point_down(graph):
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph.internal.items()
        for target in targets
        if _top(target) not in MAY_IMPORT[_top(module)]
    )
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_modules_import_from_the_defining_module(graph):
    """A package's __init__ re-exports for callers outside it; a module inside that imports through it
    runs the whole package first, which is a cycle as soon as the package imports that module back."""
    wrong = sorted(
        f"{module} imports its package {package}"
        for module, path in graph.files.items()
        if not path.endswith("__init__.py") and "." in module
        for package in [module.rpartition(".")[0]]
        if package in graph.internal[module]
    )
    assert not wrong, "\n".join(wrong)


def test_architecture_doc_has_the_code_imports(graph):
    assert doc_table(DOC.read_text()) == table(graph), (
        f"the import table in docs/architecture.md differs from the code; rewrite it with `{WRITE_COMMAND}`"
    )


def test_the_walk_resolves_relative_lazy_and_package_imports(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("from .first import thing\n")
    (tmp_path / "engine" / "first.py").write_text("import numpy\n\ndef later():\n    from . import second\n")
    (tmp_path / "engine" / "second.py").write_text("from engine import thing\nimport os.path\n")
    (tmp_path / "app.py").write_text("import engine.first\nfrom engine.second import x\n")

    found = read_graph(tmp_path)

    assert found.internal == {
        "engine": {"engine.first"},
        "engine.first": {"engine.second"},
        "engine.second": {"engine"},
        "app": {"engine.first", "engine.second"},
    }
    assert found.external["engine.first"] == {"numpy"} and found.external["engine.second"] == set()
    assert cycles(found) == [["engine", "engine.first", "engine.second", "engine"]]
    assert table(found).splitlines()[2] == "| `app.py` | `engine.first`, `engine.second` | — |"


def _room(module: str) -> str | None:
    """The engine room of a module ("reading", ...), "vocabulary", "top" (engine.py, prepare.py, the package
    and __main__), or None outside engine/."""
    parts = module.split(".")
    if parts[0] != "engine":
        return None
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in ROOM_MAY_IMPORT):
        return parts[1]
    return "vocabulary" if module in VOCABULARY else "top"


def room_violations(graph: Graph) -> list[str]:
    """Every import of engine/ against the room rules above, one line each."""
    wrong = []
    for module, targets in sorted(graph.internal.items()):
        room = _room(module)
        if room is None or room == "top":
            continue
        allowed = {room, "vocabulary"} | ROOM_MAY_IMPORT.get(room, set())
        for target in sorted(targets):
            target_room = _room(target)
            if target_room is not None and target_room not in allowed:
                wrong.append(f"{module} ({room}) imports {target} ({target_room})")
        if module.endswith(".__init__") or graph.files[module].endswith("__init__.py") and room in ROOM_MAY_IMPORT:
            if targets or graph.external[module]:
                wrong.append(f"{module}: a room's __init__.py imports nothing (the reader loads engine bare)")
        if loaded := graph.external[module] & NEVER_LOADS.get(room, set()):
            wrong.append(f"{module} ({room}) loads {', '.join(sorted(loaded))} when it runs")
    return wrong


def test_engine_rooms_import_one_way(graph):
    wrong = room_violations(graph)
    assert not wrong, "imports against engine/'s rooms:\n" + "\n".join(wrong)


def test_every_engine_room_is_placed(graph):
    folders = {
        module.split(".")[1]
        for module, path in graph.files.items()
        if module.startswith("engine.") and path.count("/") > 1
    }
    assert folders == set(ROOM_MAY_IMPORT)
    assert {module for module in graph.files if _room(module) == "vocabulary"} == VOCABULARY


@pytest.mark.parametrize(
    "module, line, complaint",
    [
        ("engine.state.lm_state", "from engine.worker.lm import LMInput", "(worker)"),
        ("engine.families.base", "from engine.reading.video import SampledVideo", "(reading)"),
        ("engine.reading.segments", "import torch", "loads torch"),
        ("engine.scheduling.scheduler", "import torch", "loads torch"),
        ("engine.front.door", "from engine.engine import Engine", "(top)"),
        ("engine.stats", "from engine.state.lm_state import LMState", "(state)"),
        ("engine.reading", "import numpy", "imports nothing"),
    ],
)
def test_room_rules_see_a_wrong_import(graph, module, line, complaint):
    """Each rule goes red on the import it forbids (read from a copy of the graph with that one import added)."""
    internal = {name: set(targets) for name, targets in graph.internal.items()}
    external = {name: set(packages) for name, packages in graph.external.items()}
    if line.startswith("import "):
        external[module].add(line.split()[1])
    else:
        internal[module].add(line.split()[1])
    wrong = room_violations(Graph(graph.files, internal, external, graph.annotations))
    assert any(module in found and complaint in found for found in wrong), wrong


def test_engine_rooms_stay_small():
    """No folder of engine/ holds more than 12 modules, and no module of engine/, pruning/ or replicas/ more than
    450 lines: past that a file holds two concerns, and a room two stages. (ui/ is not in rooms yet.)"""
    root = DOC.parent.parent
    engine_dir = root / "engine"
    crowded = {
        str(folder): count
        for folder in [engine_dir, *engine_dir.iterdir()]
        if folder.is_dir() and (count := len(list(folder.glob("*.py")))) > MAX_FILES_PER_FOLDER
    }
    long = {
        str(path): lines
        for package in ("engine", "pruning", "replicas")
        for path in (root / package).rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_LINES_PER_FILE
    }
    assert not crowded and not long, (crowded, long)
