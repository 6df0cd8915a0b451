"""The package's import structure, read from the source with `ast` (nothing is imported): no import circles, the
runtime never depends on the training code, imports sit at the top of their modules (but for a short list of lazy
ones, each with its reason), and nothing imports upward: dynasd and viz below the page's ui package, app.py on top,
and inside dynasd its own layers, from what the kernels build on up to the commands, the explorer's rooms apart.

Why these rules: an import circle works only as long as some import stays hidden inside a function, and breaks
(or changes what loads first) as soon as someone moves it; the runtime (decoders, app, bench, figures) must load
and run without the training commands, which only `dynasd/cli.py` names, as strings, to dispatch to them; the
engine and the figures must work without the page (the bench, the CLI, a notebook), so they never import ui or app.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FUNCTION_MOST_LINES = 60
TRAINING = "dynasd.training"
# The one place the runtime names the training commands: cli.py's command table (module names as strings).
COMMAND_TABLE = "dynasd.cli"
# Import layers: a module may import its own layer or a lower one, never a higher one.
LAYERS = {"dynasd": 0, "viz": 0, "ui": 1, "app": 2}
# dynasd's own layers, lowest first; a module belongs to the layer of its longest matching prefix ("dynasd" alone:
# every other top-level module, the engine's core). Why this order: the kernels are applied at load time, so the
# model loading (core) imports them and they import only the cache and file helpers below them; the candidate
# sources and decoders run on the core; the bench measures decoders; the explorer shows and measures them, its hall
# under its rooms and the sessions on top; the commands (the CLI, the best-tree search's command, `dynasd costs`,
# which times the explorer's cost table beside the bench's levels, training) drive it all.
DYNASD_LAYERS = (
    ("what the kernels build on", ("dynasd.cache", "dynasd.loading.feature_model", "dynasd.loading.embedded",
                                   "dynasd.loading.shared_module")),
    ("kernels", ("dynasd.kernels",)),
    ("core", ("dynasd",)),
    ("sources and decoders", ("dynasd.sources", "dynasd.decoders")),
    ("bench", ("dynasd.bench",)),
    ("the explorer's hall", ("dynasd.explorer",)),
    ("the explorer's costs and lessons", ("dynasd.explorer.costs", "dynasd.explorer.lessons")),
    ("the explorer's measure", ("dynasd.explorer.measure",)),
    ("the explorer's sessions", ("dynasd.explorer.sessions",)),
    ("commands", ("dynasd.cli", "dynasd.__main__", "dynasd.speed.best_tree", "dynasd.bench.costs",
                  "dynasd.training")),
)
# Rooms that stand side by side: neither imports the other (a lesson is arithmetic on a recorded run, never a cost or
# a measurement).
APART = (("dynasd.explorer.costs", "dynasd.explorer.lessons"), ("dynasd.explorer.measure", "dynasd.explorer.lessons"))
ROOM_MOST_LINES = 2000  # a room of the explorer a newcomer can still read through
# The imports that stay inside a function, each with why: a module that is optional or exists only in one place, or
# a heavy one a command loads only when it is used. Every other import sits at the top of its module.
LAZY_IMPORTS = {
    ("dynasd.bench.command", "dynasd.bench.report"):
        "plotly loads only when a report is written: the runtime imports neither plotly nor gradio",
    ("dynasd.bench.llama_cpp_peer", "llama_cpp"): "an optional extra (peers): the bench runs without it and says so",
    ("ui.gpu", "spaces.zero.torch"): "only the real spaces package, on a ZeroGPU Space, has the CUDA emulation",
    ("dynasd.loading.converted", "gguf"): "only converting a GGUF file reads it: scripts/gpu_check.py's machine has "
                                          "no gguf",
    ("dynasd.kernels.block_weights", "gguf"): "only quantizing a draft to Q8_0 needs it: the GPU check's machine has "
                                              "no gguf",
    ("dynasd.kernels.block_weights", "gguf.quants"): "as gguf, in the same function",
    ("dynasd.kernels.compile", "torch"):
        "the kernel cache is read and built by processes that load no model: torch loads with a library, not before",
}


@dataclass(frozen=True)
class Import:
    source: str         # the importing module
    target: str         # the imported module of the package (the submodule when `from pkg import submodule`)
    line: int
    in_function: bool   # inside a function body (run on call, not on import)
    commented: bool     # the import line, or the line above it, carries a comment


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_files() -> dict[str, Path]:
    """Every module of the dynasd package, of viz/ and of ui/, plus app.py, by dotted name."""
    files = [*sorted((ROOT / "dynasd").rglob("*.py")), *sorted((ROOT / "viz").rglob("*.py")),
             *sorted((ROOT / "ui").rglob("*.py")), ROOT / "app.py"]
    return {module_name(f): f for f in files}


def import_statements(tree: ast.AST):
    """Every import statement of a module, internal or not, with whether it sits inside a function body."""
    def visit(node: ast.AST, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            yield from visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                      ast.Lambda)))
    yield from visit(tree, False)


def has_comment(lines: list[str], node: ast.stmt) -> bool:
    """The statement's line, or the line above it, carries a comment (the reason an import is where it is)."""
    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
    return "#" in lines[node.lineno - 1] or above.startswith("#")


def imports_of(name: str, path: Path, known: set[str]) -> list[Import]:
    """The package-internal imports of one module, at module level and inside functions."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def add(node: ast.stmt, target: str, in_function: bool) -> None:
        # `import a.b.c` and `from a.b import c` name the deepest module of the package they reach
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.append(Import(name, target, node.lineno, in_function, has_comment(lines, node)))

    for node, in_function in import_statements(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node, alias.name, in_function)
            continue
        base = node.module or ""
        if node.level:
            anchor = package
            for _ in range(node.level - 1):
                anchor = anchor.rpartition(".")[0]
            base = f"{anchor}.{node.module}" if node.module else anchor
        for alias in node.names:
            full = f"{base}.{alias.name}"
            add(node, full if full in known else base, in_function)
    return found


def string_imports_of(name: str, path: Path) -> list[tuple[str, int, str]]:
    """`importlib.import_module("...")` / `__import__("...")` calls with a literal module name."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__"):
                calls.append((name, node.lineno, node.args[0].value))
    return calls


def all_imports() -> list[Import]:
    files = package_files()
    return [imp for name, path in files.items() for imp in imports_of(name, path, set(files))]


def import_cycles(imports: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every module in one
    reaches every other through imports."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(components)


def layer(module: str) -> int:
    return LAYERS[module.partition(".")[0]]


def in_training(module: str) -> bool:
    return module == TRAINING or module.startswith(TRAINING + ".")


def test_the_reader_finds_imports_at_module_level_inside_functions_relative_and_absolute(tmp_path):
    """The analysis itself: a known circle through a function-level import is found."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("from . import b\nfrom .c import thing  # optional\n")
    (pkg / "b.py").write_text("import os\n\n\ndef f():\n    from pkg.a import g\n    return g\n")
    (pkg / "c.py").write_text("thing = 1\n")
    known = {"pkg.a", "pkg.b", "pkg.c"}
    found = [imp for mod in ("a", "b", "c") for imp in imports_of(f"pkg.{mod}", pkg / f"{mod}.py", known)]
    assert [(i.source, i.target, i.in_function, i.commented) for i in found] == [
        ("pkg.a", "pkg.b", False, False), ("pkg.a", "pkg.c", False, True), ("pkg.b", "pkg.a", True, False)]
    assert import_cycles(found) == [["pkg.a", "pkg.b"]]


def test_the_package_has_no_import_circle():
    """Function-level imports count: a circle closed only inside a function is still a circle."""
    assert import_cycles(all_imports()) == []


def test_every_module_belongs_to_a_layer():
    assert {name.partition(".")[0] for name in package_files()} == set(LAYERS)


def test_nothing_imports_upward():
    """dynasd and viz never import the page (ui) or app.py; ui never imports app.py; function-level imports
    count."""
    upward = [f"{i.source}:{i.line} imports {i.target}" for i in all_imports() if layer(i.target) > layer(i.source)]
    named = [f"{name}:{line} loads {target}" for name, path in package_files().items()
             for _, line, target in string_imports_of(name, path)
             if target.partition(".")[0] in LAYERS and layer(target) > layer(name)]
    assert upward + named == []


def test_the_layer_rule_catches_an_upward_import(tmp_path):
    """The analysis itself: an engine module that imports the page is reported."""
    (tmp_path / "dynasd").mkdir()
    (tmp_path / "ui").mkdir()
    (tmp_path / "dynasd" / "engine.py").write_text("def f():\n    from ui import layout\n")
    (tmp_path / "ui" / "layout.py").write_text("import dynasd.engine\n")
    known = {"dynasd.engine", "ui.layout", "ui"}
    found = [*imports_of("dynasd.engine", tmp_path / "dynasd" / "engine.py", known),
             *imports_of("ui.layout", tmp_path / "ui" / "layout.py", known)]
    upward = [(i.source, i.target) for i in found if layer(i.target) > layer(i.source)]
    assert upward == [("dynasd.engine", "ui.layout")]


def test_nothing_outside_the_training_package_imports_it():
    """Only cli.py's command table names the training commands, as strings, and loads one on demand."""
    files = package_files()
    imports = [f"{i.source}:{i.line} imports {i.target}" for i in all_imports()
               if in_training(i.target) and not in_training(i.source)]
    named = [f"{name}:{line} loads {target}" for name, path in files.items() if not in_training(name)
             and name != COMMAND_TABLE for _, line, target in string_imports_of(name, path) if in_training(target)]
    assert imports + named == []


def test_function_level_imports_are_counted_and_the_training_package_has_only_optional_ones():
    """Printed for every module (a map of what still waits inside functions); inside dynasd/training only an
    optional dependency may be imported in a function, with a comment saying why."""
    counts: dict[str, int] = {}
    uncommented = []
    for name, path in package_files().items():
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        inside = [node for node, in_function in import_statements(ast.parse(source)) if in_function]
        if inside:
            counts[name] = len(inside)
        if in_training(name):
            uncommented += [f"{name}:{node.lineno}" for node in inside if not has_comment(lines, node)]
    print("\nfunction-level import statements per module:")
    for name in sorted(counts):
        print(f"  {counts[name]:3d}  {name}")
    print(f"  {sum(counts.values()):3d}  in all")
    assert uncommented == []


def dynasd_group(module: str) -> tuple[int, str]:
    """(layer index, the prefix that placed it) of a dynasd module: its longest matching prefix."""
    best = (-1, "", "")
    for index, (_, prefixes) in enumerate(DYNASD_LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best[1]):
                best = (index, prefix, prefix)
    return best[0], best[2]


def dynasd_layer_breaks(imports: list[Import]) -> list[str]:
    """Every import inside dynasd that goes up its layers, or across rooms that stand apart."""
    found = []
    for imp in imports:
        if not (imp.source.startswith("dynasd") and imp.target.startswith("dynasd")):
            continue
        (source_layer, source_group), (target_layer, target_group) = dynasd_group(imp.source), dynasd_group(imp.target)
        apart = any({source_group, target_group} == set(pair) for pair in APART)
        if target_layer > source_layer or apart:
            found.append(f"{imp.source}:{imp.line} imports {imp.target} "
                         f"({DYNASD_LAYERS[source_layer][0]} -> {DYNASD_LAYERS[target_layer][0]})")
    return found


def test_inside_dynasd_imports_only_go_down_its_layers_and_the_rooms_stay_apart():
    """The kernels below the model loading, the decoders below the bench, the explorer's hall below its rooms, the
    costs under the measurements and both apart from the lessons, sessions on top, the commands above everything;
    function-level imports count."""
    assert dynasd_layer_breaks(all_imports()) == []


def test_the_dynasd_layer_rule_catches_a_room_that_reads_another_and_a_kernel_that_reads_the_loader():
    """The analysis itself, on made-up imports."""
    made_up = [Import("dynasd.explorer.lessons.quiz", "dynasd.explorer.costs.cost", 3, False, False),
               Import("dynasd.kernels.block_weights", "dynasd.loading.converted", 9, True, False),
               Import("dynasd.explorer.sessions.session", "dynasd.explorer.engine", 1, False, False),
               Import("dynasd.loading.models", "dynasd.kernels", 1, False, False)]
    assert [line.split(":")[0] for line in dynasd_layer_breaks(made_up)] == [
        "dynasd.explorer.lessons.quiz", "dynasd.kernels.block_weights"]


def test_no_room_of_the_explorer_is_too_big_to_read_through():
    explorer = ROOT / "dynasd" / "explorer"
    rooms = {"hall": sorted(explorer.glob("*.py")), **{room.name: sorted(room.glob("*.py"))
                                                      for room in explorer.iterdir() if room.is_dir()
                                                      and (room / "__init__.py").exists()}}
    sizes = {name: sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files) for name, files in rooms.items()}
    assert set(sizes) >= {"hall", "costs", "measure", "lessons", "sessions"}
    assert {name: lines for name, lines in sizes.items() if lines > ROOM_MOST_LINES} == {}


def test_the_architecture_page_names_every_module():
    """docs/ARCHITECTURE.md is where a newcomer finds a module's one job: every module of dynasd, ui, viz and
    scripts is named there by its file name (a package's __init__.py by its folder)."""
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    modules = [path for folder in ("dynasd", "ui", "viz", "scripts") for path in (ROOT / folder).rglob("*.py")
               if path.name != "__init__.py" and "__pycache__" not in path.parts]
    assert len(modules) > 100
    # a whole file name: cost.py is not named by step_cost.py
    unnamed = [path for path in modules if not re.search(rf"(?<![\w.]){re.escape(path.name)}", page)]
    assert [str(path.relative_to(ROOT)) for path in unnamed] == []


def test_the_page_and_the_explorer_read_in_short_functions_and_ui_catches_everything_once():
    """A function of ui/, viz/ or dynasd/explorer/ fits on a screen (at most FUNCTION_MOST_LINES, its decorators
    aside), and ui/ has one `except Exception`: the handler decorator's, which logs the traceback and says the
    failure in one line (every other handler failure is a named one)."""
    long_ones, catch_alls = [], []
    for folder in ("ui", "viz", "dynasd/explorer"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            long_ones += [f"{path.relative_to(ROOT)}:{node.name} {node.end_lineno - node.lineno + 1} lines"
                          for node in ast.walk(ast.parse(text))
                          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                          and node.end_lineno - node.lineno + 1 > FUNCTION_MOST_LINES]
            if folder == "ui":
                catch_alls += [path.name for line in text.splitlines() if line.strip().startswith("except Exception")]
    assert long_ones == []
    assert catch_alls == ["handler.py"]


def function_level_imports() -> list[tuple[str, int, str]]:
    """(module, line, imported module) of every import inside a function, in dynasd, viz, ui and app.py; a
    relative import is named absolutely, `from a import b` by `a`."""
    found = []
    for name, path in package_files().items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, in_function in import_statements(ast.parse(path.read_text(encoding="utf-8"))):
            if not in_function:
                continue
            if isinstance(node, ast.Import):
                found += [(name, node.lineno, alias.name) for alias in node.names]
                continue
            anchor = package
            for _ in range(max(node.level - 1, 0)):
                anchor = anchor.rpartition(".")[0]
            base = (f"{anchor}.{node.module}" if node.module else anchor) if node.level else node.module
            found.append((name, node.lineno, base))
    return found


def test_imports_sit_at_the_top_of_their_modules_but_for_the_listed_lazy_ones():
    """A lazy import hides what a module needs and can hide a circle; the few that must stay are listed with their
    reason, and an entry nothing uses any more is dropped from the list."""
    found = function_level_imports()
    unlisted = [f"{module}:{line} imports {target}" for module, line, target in found
                if (module, target) not in LAZY_IMPORTS]
    used = {(module, target) for module, _, target in found}
    assert unlisted == [] and [key for key in LAZY_IMPORTS if key not in used] == []


def test_the_wheel_declares_every_package_and_carries_the_top_level_assets():
    """pyproject.toml lists the packages by name (so that assets/ can be mapped to dynasd/assets): a new subpackage
    left out of the list would be missing from the wheel."""
    from dynasd.loading.models import ASSETS_DIR

    text = (ROOT / "pyproject.toml").read_text()
    declared = text.split("packages = [", 1)[1].split("]", 1)[0]
    folders = {str(p.parent.relative_to(ROOT)).replace("/", ".") for p in ROOT.glob("dynasd/**/*.py")}
    assert all(f'"{name}"' in declared for name in folders | {"viz", "ui", "dynasd.assets"}), declared
    assert '"dynasd.assets" = "assets"' in text
    assert ASSETS_DIR == ROOT / "assets" and (ASSETS_DIR / "examples").is_dir()
