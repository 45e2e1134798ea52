"""The project's imports, read from the source (tests/import_graph.py; nothing is imported, no model loads):
no Gradio below the UI, no cycles, dependencies pointing down, and docs/architecture.md's table in step."""

import pytest

from import_graph import DOC, WRITE_COMMAND, Graph, cycles, doc_table, read_graph, table

# What each top-level part may import of the project (docs/architecture.md, "Modules"): evs stands
# alone, engine sits on evs, the UI on the engine, and only the app chooses between the UI's engine
# and replicas. bench and train are imported by tests alone.
MAY_IMPORT = {
    "evs": {"evs"},
    "engine": {"engine", "evs"},
    "assets": {"assets", "engine"},
    "replicas": {"replicas", "engine", "evs", "assets"},
    "ui": {"ui", "engine", "evs", "assets"},
    "app": {"app", "ui", "replicas", "engine", "evs", "assets"},
    "bench": {"bench", "replicas", "engine", "evs", "assets"},
    "train": {"train", "engine", "evs", "assets"},
}
GRADIO_FREE = ("engine", "evs", "replicas")


@pytest.fixture(scope="module")
def graph() -> Graph:
    return read_graph()


def _top(module: str) -> str:
    return module.partition(".")[0]


def test_every_part_is_placed(graph):
    assert {_top(module) for module in graph.files} == set(MAY_IMPORT)


def test_no_gradio_below_the_ui(graph):
    offenders = sorted(module for module in graph.files if _top(module) in GRADIO_FREE
                       and graph.external[module] & {"gradio", "gradio_client"})
    assert not offenders, f"these modules import Gradio, which only ui/ and app.py may: {offenders}"


def test_no_import_cycles(graph):
    found = [" -> ".join(cycle) for cycle in cycles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_dependencies_point_down(graph):
    wrong = sorted(f"{module} imports {target}" for module, targets in graph.internal.items()
                   for target in targets if _top(target) not in MAY_IMPORT[_top(module)])
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_modules_import_from_the_defining_module(graph):
    """A package's __init__ re-exports for callers outside it; a module inside that imports through it
    runs the whole package first, which is a cycle as soon as the package imports that module back."""
    wrong = sorted(f"{module} imports its package {package}" for module, path in graph.files.items()
                   if not path.endswith("__init__.py") and "." in module
                   for package in [module.rpartition(".")[0]] if package in graph.internal[module])
    assert not wrong, "\n".join(wrong)


def test_architecture_doc_has_the_code_imports(graph):
    assert doc_table(DOC.read_text()) == table(graph), (
        f"the import table in docs/architecture.md differs from the code; rewrite it with `{WRITE_COMMAND}`")


def test_the_walk_resolves_relative_lazy_and_package_imports(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("from .first import thing\n")
    (tmp_path / "engine" / "first.py").write_text("import numpy\n\ndef later():\n    from . import second\n")
    (tmp_path / "engine" / "second.py").write_text("from engine import thing\nimport os.path\n")
    (tmp_path / "app.py").write_text("import engine.first\nfrom engine.second import x\n")

    found = read_graph(tmp_path)

    assert found.internal == {"engine": {"engine.first"}, "engine.first": {"engine.second"},
                              "engine.second": {"engine"}, "app": {"engine.first", "engine.second"}}
    assert found.external["engine.first"] == {"numpy"} and found.external["engine.second"] == set()
    assert cycles(found) == [["engine", "engine.first", "engine.second", "engine"]]
    assert table(found).splitlines()[2] == "| `app.py` | `engine.first`, `engine.second` | — |"

