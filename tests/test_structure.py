"""The shape of the package: sub-packages along the data's way (sources -> inputs -> forward -> reductions ->
output), the job and the faces above them; imports only go down or sideways within a package, never in a
cycle; the library never imports click."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "featdump"


@functools.cache
def nodes_of(path: Path) -> tuple[ast.AST, ...]:
    """Every node of PATH's syntax tree, parsed once for all the tests of this file."""
    return tuple(ast.walk(ast.parse(path.read_text())))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def featdump_imports(path: Path, modules: set[str]) -> set[str]:
    """Every featdump module PATH imports, at its top or inside a function (a lazy import is still an edge)."""
    found = set()
    for node in nodes_of(path):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("featdump")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("featdump"):
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules
            found |= submodules or {node.module}
    return found & modules


def import_graph() -> dict[str, set[str]]:
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: featdump_imports(path, set(files)) - {name} for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = "open"
        stack.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[name] = "done"
        stack.pop()
        return None

    for name in sorted(graph):
        if name not in state and (cycle := visit(name)):
            return cycle
    return None


def test_the_walker_finds_a_cycle_when_there_is_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_featdump_modules_import_each_other_without_a_cycle():
    graph = import_graph()
    assert len(graph) > 30 and "featdump.engines.choice" in graph["featdump.faces.cli"]  # the walk sees the package
    assert "featdump.job.staging" in graph["featdump.engines.choice"]  # (the CLI reached staging through it)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def importers_of(package: str) -> list[str]:
    """The featdump modules that import PACKAGE (or a module of it), lazily or not."""
    def imports(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        return [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []

    return sorted(name for name, path in ((module_name(p), p) for p in PACKAGE.rglob("*.py"))
                  if any(found == package or found.startswith(package + ".")
                         for node in nodes_of(path) for found in imports(node)))


def test_only_the_cli_imports_click():
    """The CLI (its group, its commands, its analysis commands), and the readers' conformance kit that drives it as
    a user does (click's test runner)."""
    assert importers_of("click") == ["featdump.faces.analysis_commands", "featdump.faces.cli",
                                     "featdump.faces.group", "featdump.testing.readers"]


def test_only_the_ray_engine_imports_ray():
    assert importers_of("ray") == ["featdump.engines.ray"]


# Lowest first: a module may import modules of its own rank or lower, never higher.
RANKS = {
    "featdump.errors": 0, "featdump.version": 0, "featdump.locations": 0, "featdump.progress": 0,
    "featdump.plugins": 0, "featdump.caches": 0,
    "featdump.sources": 1, "featdump.inputs": 2, "featdump.forward": 3, "featdump.reductions": 4,
    "featdump.output": 5, "featdump.job": 6, "featdump.analysis": 6, "featdump.training": 6, "featdump.readout": 6,
    "featdump.units": 6,
    "featdump.faces": 7, "featdump.engines": 7,
    "featdump": 8, "featdump.__main__": 8,
}


def rank_of(module: str) -> int:
    """The rank of MODULE's package (its longest prefix in RANKS)."""
    for prefix in sorted(RANKS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return RANKS[prefix]
    raise AssertionError(f"{module} is in no package of the layout")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{name} -> {target}" for name, targets in graph.items() for target in targets
                  if rank_of(target) > rank_of(name))


def test_the_rank_check_finds_an_upward_import():
    assert upward_imports({"featdump.forward.hooks": {"featdump.output.writer"}}) == [
        "featdump.forward.hooks -> featdump.output.writer"]
    assert upward_imports({"featdump.output.writer": {"featdump.forward.hooks"}}) == []


def test_every_module_sits_in_a_package_of_the_pipeline_and_imports_only_downwards():
    graph = import_graph()
    flat = sorted(name for name in graph if name.count(".") == 1 and rank_of(name) not in (0, 8)
                  and not (PACKAGE / name.split(".")[1]).is_dir())
    assert not flat, f"modules outside the sub-packages: {flat}"
    assert not upward_imports(graph), "\n".join(upward_imports(graph))


def test_every_package_says_what_lives_in_it():
    for init in PACKAGE.rglob("__init__.py"):
        docstring = ast.get_docstring(ast.parse(init.read_text()))
        assert docstring and len(docstring) > 80, f"{init.relative_to(PACKAGE.parent)} has no paragraph"


def test_no_package_shadows_a_name_of_the_api():
    import importlib
    import types

    import featdump

    for path in PACKAGE.rglob("*.py"):  # every module imported: each sets its name on its package
        if path.name != "__main__.py":
            importlib.import_module(module_name(path))
    shadowed = [name for name in featdump.__all__ if isinstance(getattr(featdump, name), types.ModuleType)]
    assert not shadowed, f"sub-packages hide these names of the API: {shadowed}"


def test_the_runner_s_rooms_never_import_what_strings_them():
    """`job.model`, `job.plan`, `job.batches` and `job.provenance` are strung by the runner (and called by updating
    and fitting): none imports them back."""
    graph = import_graph()
    above = {"featdump.job.runner", "featdump.job.updating", "featdump.job.fitting", "featdump.job.staging"}
    for room in ("model", "plan", "batches", "provenance"):
        assert not graph[f"featdump.job.{room}"] & above, room
    assert "featdump.job.batches" in graph["featdump.job.updating"]  # the typed API, not a callback
    assert "featdump.job.batches" in graph["featdump.job.fitting"]  # a PCA fit stages through it too


def modules_telling_a_path_from_a_url() -> set[str]:
    """The featdump modules that tell a path here from a URL: they read a Location's `remote` (a Ray handle's
    `.remote()` calls aside) or split a text at `://`."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        called = {id(node.func) for node in nodes_of(path) if isinstance(node, ast.Call)}
        if any(isinstance(node, ast.Attribute) and node.attr == "remote" and id(node) not in called
               or isinstance(node, ast.Constant) and node.value == "://" for node in nodes_of(path)):
            found.add(module_name(path))
    return found


def test_three_modules_tell_a_path_here_from_a_url():
    """The Location itself, the inputs' readers and the outputs' places; every other module asks them."""
    assert modules_telling_a_path_from_a_url() == {"featdump.locations", "featdump.inputs.readers",
                                                   "featdump.output.places"}


BENCHMARKS = PACKAGE.parent / "benchmarks"


def test_the_benchmarks_are_a_package_that_imports_of_the_tests_only_their_makers_and_never_edits_the_path():
    files = {f"benchmarks.{path.stem}": path for path in BENCHMARKS.glob("*.py") if path.stem != "__init__"}
    graph = {}
    for name, path in files.items():
        imported = {node.module for node in nodes_of(path) if isinstance(node, ast.ImportFrom) and node.module}
        imported |= {alias.name for node in nodes_of(path) if isinstance(node, ast.Import) for alias in node.names}
        tests = {module for module in imported if module == "tests" or module.startswith("tests.")}
        assert all(module.startswith("tests.makers") for module in tests), name  # what makes data, not a test
        assert "sys.path" not in path.read_text(), f"{name} edits sys.path"
        graph[name] = {module for module in imported if module in files} | {
            f"benchmarks.{alias.name}" for node in nodes_of(path) if isinstance(node, ast.ImportFrom)
            and node.module == "benchmarks" for alias in node.names}
    assert len(graph) > 20 and "benchmarks.common" in graph["benchmarks.tars"]  # the walk sees the package
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_a_benchmark_writes_its_own_section_of_the_results_and_nothing_else(tmp_path):
    from benchmarks.common import write_section

    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Notes by hand\n\nkept\n")
    write_section("run", "| new |", results)
    write_section("tars", "tars' table", results)
    write_section("run", "| newer |", results)
    text = results.read_text()
    assert text.count("<!-- run: begin") == 1 and "| newer |" in text and "| new |" not in text
    assert "tars' table" in text and text.endswith("## Notes by hand\n\nkept\n") and text.startswith("# Benchmark")


def test_the_house_keeps_its_sizes():
    """No module over 450 lines, at most two over 400, no function over 60: a module that grows past them is split
    by concept (as faces/cli.py into the group, its commands and the analysis commands)."""
    sizes = {path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text().splitlines())
             for path in PACKAGE.rglob("*.py")}
    assert not {name: lines for name, lines in sizes.items() if lines > 450}
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:4]
    assert len([name for name, lines in sizes.items() if lines > 400]) <= 2, largest
    long_functions = [(path.name, node.name, node.end_lineno - node.lineno + 1) for path in PACKAGE.rglob("*.py")
                      for node in nodes_of(path)
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.end_lineno - node.lineno + 1 > 60]
    assert not long_functions
