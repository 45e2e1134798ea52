"""The project's imports as a graph, read from the source with `ast` (nothing is imported), and the table
of it that docs/architecture.md carries between its import-table markers.

    python tests/import_graph.py            # print the table
    python tests/import_graph.py --write    # rewrite the doc's table from the code

Every import counts, at module level or inside a function (a lazy import still ties the two modules).
A relative import is resolved against its package. `from package import name` is an edge to the submodule
`package.name` when there is one, otherwise to the package's `__init__.py`; `import a.b` is an edge to
`a.b`. Modules are named as Python names them: `engine.reading.video`, `engine` for engine/__init__.py, `app`.
An import under `if TYPE_CHECKING:` ties two modules of the project all the same (layering and cycles count
it), but a third-party package imported there alone never loads: it is listed apart, as "for annotations".
"""

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL = ("app", "assets", "bench", "engine", "evs", "pruning", "replicas", "train", "ui")
DOC = ROOT / "docs" / "architecture.md"
START, END = "<!-- import-table:start -->", "<!-- import-table:end -->"
WRITE_COMMAND = "python tests/import_graph.py --write"


@dataclass(frozen=True)
class Graph:
    """files: module name -> its path relative to the root. internal: module -> project modules it
    imports. external: module -> top-level names of the third-party packages it imports."""

    files: dict[str, str]
    internal: dict[str, set[str]]
    external: dict[str, set[str]]
    annotations: dict[str, set[str]]  # third-party packages imported under TYPE_CHECKING only


def read_graph(root: Path = ROOT) -> Graph:
    files = _project_files(root)
    internal, external, annotations = {}, {}, {}
    for module, path in files.items():
        internal[module], external[module], annotations[module] = _imports(module, root / path, files)
    return Graph(files, internal, external, annotations)


def _project_files(root: Path) -> dict[str, str]:
    files = {}
    for top in TOP_LEVEL:
        single = root / f"{top}.py"
        paths = [single] if single.is_file() else sorted((root / top).rglob("*.py"))
        for path in paths:
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path.relative_to(root).as_posix()
    return files


def _imports(module: str, path: Path, files: dict[str, str]) -> tuple[set[str], set[str], set[str]]:
    """(project modules, third-party packages at run time, third-party packages for annotations only)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    internal, external, typing_only = set(), set(), set()

    def add(name: str, for_types: bool) -> None:
        top = name.partition(".")[0]
        if top in TOP_LEVEL:
            while name not in files and "." in name:  # `import a.b.missing` still runs a.b
                name = name.rpartition(".")[0]
            if name in files and name != module:
                internal.add(name)
        elif top not in sys.stdlib_module_names:
            (typing_only if for_types else external).add(top)

    def visit(node: ast.AST, for_types: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, for_types)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                add(submodule if submodule in files else base, for_types)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, for_types)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, for_types)

    visit(ast.parse(path.read_text(), str(path)), False)
    return internal, external, typing_only - external


def _is_type_checking(test: ast.expr) -> bool:
    """`TYPE_CHECKING` or `typing.TYPE_CHECKING`."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def cycles(graph: Graph) -> list[list[str]]:
    """One cycle (a list of modules, the first repeated at the end) per strongly connected component
    of more than one module, found with Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.internal[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph.internal):
        if node not in index:
            visit(node)
    return [_cycle_within(graph, component) for component in components]


def _cycle_within(graph: Graph, component: set[str]) -> list[str]:
    """The shortest way from the component's first module back to itself, inside the component."""
    start = min(component)
    previous = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph.internal[node] & component):
                if target == start:
                    path = [node]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def table(graph: Graph) -> str:
    """The markdown table: one row per module, by path, with what it imports."""
    lines = ["| module | imports of the project | third-party imports |", "|---|---|---|"]
    for module, path in sorted(graph.files.items(), key=lambda item: item[1]):
        internal = ", ".join(f"`{name}`" for name in sorted(graph.internal[module])) or "—"
        external = (
            ", ".join(
                [
                    *(f"`{name}`" for name in sorted(graph.external[module])),
                    *(f"`{name}` (annotations)" for name in sorted(graph.annotations[module])),
                ]
            )
            or "—"
        )
        lines.append(f"| `{path}` | {internal} | {external} |")
    return "\n".join(lines) + "\n"


def doc_table(doc: str) -> str:
    """The text between the doc's markers, without the newlines that follow the start and end them."""
    if START not in doc or END not in doc:
        raise ValueError(f"{DOC.relative_to(ROOT)} has no {START} ... {END} section")
    return doc.split(START, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def write(graph: Graph) -> None:
    doc = DOC.read_text()
    doc_table(doc)  # the markers must be there
    head, rest = doc.split(START, 1)
    tail = rest.split(END, 1)[1]
    DOC.write_text(f"{head}{START}\n{table(graph)}{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite the table in {DOC.relative_to(ROOT)}")
    graph = read_graph()
    if parser.parse_args().write:
        write(graph)
    else:
        print(table(graph), end="")


if __name__ == "__main__":
    main()
