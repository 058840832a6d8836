"""The layer table of docs/architecture.md, checked against every module's imports.

``LAYERS`` is that table as data: for each layer (a package ``name/``, a top-level module ``name.py``, the
``<command>.py`` entry points, the empty root ``__init__.py``), the ZipRL layers it may import, the third-party
modules it never imports, and those it imports only inside a function (never when it is imported). Every import of
every module under ``ziprl/`` (top level, inside functions and under ``if TYPE_CHECKING``) is checked against its
row; the doc's table must say the same, and importing the light layers in a fresh interpreter loads neither torch
nor Ray. The packages follow DESIGN.md's order: scoring → retrieval → env → policy → learner → loop → actors → cli.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "ziprl"
DOC = REPO / "docs" / "architecture.md"
RAY_COMMANDS = {"ziprl/cli/launch.py"}  # the commands that may start Ray themselves
# `python -m ziprl.<command>`: the stable entry points, each a 3-line module calling ziprl.cli.<module>.main
ENTRY_POINTS = {"ziprl/demos.py", "ziprl/eval.py", "ziprl/index.py", "ziprl/launch.py",
                "ziprl/sft.py", "ziprl/train.py", "ziprl/watch_teacher.py"}
ENTRY = "<command>.py"
ROOT = "__init__.py"  # ziprl/__init__.py: empty
ORDER = ["scoring/", "retrieval/", "env/", "policy/", "learner/", "loop/", "actors/", "cli/"]  # DESIGN.md's layer order

HEAVY = frozenset({"torch", "ray", "transformers", "vllm", "deepspeed"})
GPU_EXTRAS = frozenset({"vllm", "deepspeed"})  # optional: imported only inside functions, everywhere
FOUNDATION = frozenset({"boundary.py", "paths.py", "registry.py", "config/", "outputs.py"})


@dataclass(frozen=True)
class Row:
    may_import: frozenset[str]  # ZipRL layers (besides its own)
    never: frozenset[str] = frozenset()  # third-party top-level modules it never imports
    lazy: frozenset[str] = frozenset()  # third-party modules it imports only inside a function


def row(may_import=(), never=(), lazy=()) -> Row:
    """A row; the GPU extras it may import at all, it imports only inside functions."""
    return Row(frozenset(may_import), frozenset(never), frozenset(lazy) | (GPU_EXTRAS - frozenset(never)))


LIBRARY = FOUNDATION | {"scoring/", "retrieval/", "env/", "weights/", "policy/", "tb.py", "plots.py", "learner/", "loop/",
                        "rundir.py", "evaluation/", "view/", "integrations/"}
LAYERS: dict[str, Row] = {
    "boundary.py": row((), HEAVY),
    "paths.py": row((), HEAVY),
    "outputs.py": row({"boundary.py", "paths.py"}, HEAVY),
    "registry.py": row((), HEAVY),  # imports the plug-in packages it names by name, on first lookup
    "config/": row({"boundary.py", "registry.py"}, HEAVY),
    "scoring/": row({"registry.py"}, HEAVY),
    "retrieval/": row(FOUNDATION | {"scoring/"}, HEAVY, {"sentence_transformers"}),
    "env/": row(FOUNDATION | {"scoring/", "retrieval/"}, HEAVY, {"sentence_transformers"}),
    "weights/": row(FOUNDATION, HEAVY - {"torch"}, {"torch"}),
    "policy/": row(FOUNDATION | {"scoring/", "retrieval/", "env/", "weights/"}, {"ray", "deepspeed"}),
    "tb.py": row({"paths.py"}, HEAVY - {"torch"}, {"torch"}),
    "plots.py": row({"paths.py", "env/"}, HEAVY, {"matplotlib"}),
    "learner/": row(FOUNDATION | {"scoring/", "retrieval/", "env/", "weights/", "policy/"}, {"ray"}),
    "loop/": row(FOUNDATION | {"scoring/", "retrieval/", "env/", "weights/", "policy/", "learner/", "tb.py"}, HEAVY),
    "rundir.py": row(FOUNDATION | {"learner/"}, HEAVY),
    "evaluation/": row(FOUNDATION | {"scoring/", "retrieval/", "env/", "policy/", "plots.py"}, {"ray"}),
    "view/": row(FOUNDATION | {"env/", "policy/"}, {"ray"}),
    "integrations/": row(FOUNDATION | {"scoring/", "retrieval/", "env/", "policy/"}, {"ray"}, {"trl", "datasets"}),
    "actors/": row(LIBRARY - {"evaluation/", "view/", "integrations/"}),
    "cli/": row(LIBRARY | {"actors/"}, (), HEAVY - {"ray"}),  # Ray: RAY_COMMANDS only (its own test)
    ENTRY: row({"cli/"}, HEAVY),
    ROOT: row((), HEAVY),
    "testing/": row(LIBRARY | {"actors/", "cli/"}),  # the top: tests' and benchmarks' helpers (its own test below)
}
# the layers whose every module imports neither torch nor Ray (checked in a fresh interpreter)
LIGHT = ("scoring", "retrieval", "env", "weights", "loop", "boundary", "paths", "registry", "config", "outputs", "tb", "plots",
         "rundir")


@dataclass(frozen=True)
class Import:
    name: str  # the module imported (``from a.b import c`` gives ``a.b`` and ``a.b.c``)
    lazy: bool  # inside a function (or under ``if TYPE_CHECKING``): not run when the module is imported
    line: int


def file_imports(path: Path) -> list[Import]:
    """Every import of one file, at top level, in a class body, inside a function or under TYPE_CHECKING."""
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(a.name, lazy, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import; write the absolute module name"
            found.append(Import(node.module, lazy, node.lineno))
            found.extend(Import(f"{node.module}.{a.name}", lazy, node.lineno) for a in node.names)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, lazy)
            return
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), False)
    return found


def imports() -> dict[str, list[Import]]:
    """Every module under ziprl/ (as ``ziprl/...py``) and its imports."""
    return {p.relative_to(REPO).as_posix(): file_imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of_file(rel: str) -> str:
    if rel in ENTRY_POINTS:
        return ENTRY
    parts = rel.split("/")[1:]
    return f"{parts[0]}/" if len(parts) > 1 else parts[0]


def layer_of_module(name: str) -> str | None:
    """The layer of a ``ziprl.`` module (None for another package, or ``ziprl`` itself)."""
    parts = name.split(".")
    if parts[0] != "ziprl" or len(parts) == 1:
        return None
    return f"{parts[1]}/" if (PACKAGE / parts[1]).is_dir() else f"{parts[1]}.py"


def violations() -> list[str]:
    """Every import that its module's row of LAYERS does not allow, as ``file:line: why``."""
    out = []
    for rel, found in imports().items():
        own = layer_of_file(rel)
        rule = LAYERS[own]
        for imp in found:
            target = layer_of_module(imp.name)
            top = imp.name.split(".")[0]
            where = f"{rel}:{imp.line}: {own} imports {imp.name}"
            if target is not None:
                if target != own and target not in rule.may_import:
                    out.append(f"{where} ({target} is not in its row)")
            elif top in rule.never:
                out.append(f"{where} (never)")
            elif top in rule.lazy and not imp.lazy:
                out.append(f"{where} at import time (only inside a function)")
    return out


def test_every_module_has_a_row():
    assert {layer_of_file(rel) for rel in imports()} == set(LAYERS)


def test_every_import_follows_the_layer_table():
    assert violations() == []


def test_the_table_follows_the_design_order_and_has_no_cycle():
    for i, layer in enumerate(ORDER):
        assert set(ORDER[:i]) <= LAYERS[layer].may_import | FOUNDATION, layer
        assert not set(ORDER[i + 1:]) & LAYERS[layer].may_import, layer
    try:
        TopologicalSorter({name: r.may_import for name, r in LAYERS.items()}).prepare()
    except CycleError as exc:
        raise AssertionError(f"the layer table has a cycle: {exc.args[1]}") from None
    assert {m for r in LAYERS.values() for m in r.may_import} <= set(LAYERS)


def doc_table() -> dict[str, Row]:
    """The rows of docs/architecture.md's layer table: layer | holds | may import | never imports | only inside
    functions; ``foundation`` and ``heavy`` stand for FOUNDATION and HEAVY."""
    text = DOC.read_text(encoding="utf-8").split("## Layering", 1)[1]
    rows: dict[str, Row] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`"):
            continue
        names = [re.findall(r"`([^`]+)`", c) for c in cells]
        may = set(names[2]) | (FOUNDATION if "foundation" in cells[2] else set())
        never = set(names[3]) | (HEAVY if "heavy" in cells[3] else set())
        rows[names[0][0]] = Row(frozenset(may), frozenset(never), frozenset(names[4]))
    return rows


def test_the_doc_table_is_this_table():
    doc = doc_table()
    assert set(doc) == set(LAYERS)
    for name, rule in LAYERS.items():
        stated = Row(rule.may_import, rule.never, rule.lazy - GPU_EXTRAS)  # the doc states the extras once
        assert doc[name] == stated, name


def test_light_layers_import_neither_torch_nor_ray():
    code = ("import importlib, pkgutil, sys\n"
            f"for name in {LIGHT!r}:\n"
            "    root = importlib.import_module('ziprl.' + name)\n"
            "    for m in pkgutil.walk_packages(getattr(root, '__path__', []), root.__name__ + '.'):\n"
            "        importlib.import_module(m.name)\n"
            "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))\n"
            "print(len([m for m in sys.modules if m.startswith(('ziprl.env.', 'ziprl.scoring.', 'ziprl.retrieval.'))]))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=REPO).stdout.split("\n")
    assert out[0] == "[]"
    assert int(out[1]) >= 30  # every submodule was imported, not just the packages


def importers(of: str) -> set[str]:
    """The modules under ziprl/ that import module ``of`` or one under it (anywhere in the file)."""
    return {f for f, found in imports().items() if any(i.name == of or i.name.startswith(f"{of}.") for i in found)}


def test_env_never_imports_policy():
    """The env is torch-free and below the policy: not even inside a function (the RLlib adapter, which loads the
    policy's tokenizer, is ``integrations/rllib.py``)."""
    assert {f for f in importers("ziprl.policy") if f.startswith("ziprl/env/")} == set()


def test_only_the_commands_import_cli():
    """``ziprl.cli`` is imported by its own modules, the top-level entry points and the test helpers above them
    (``testing/commands.py``'s table of every command) only: never by view (whose command is ``view/command.py``)
    or any other library package."""
    outside = {f for f in importers("ziprl.cli") if not f.startswith(("ziprl/cli/", "ziprl/testing/"))
               and f.count("/") > 1}
    assert outside == set()
    assert all(f.count("/") == 1 for f in ENTRY_POINTS)


def test_the_cpu_kernels_live_in_policy_cpu():
    """HFEngine's CPU speed work (modules named ``cpu_*``, C++ sources in ``csrc/``) is in ``policy/cpu/`` only."""
    home = PACKAGE / "policy" / "cpu"
    stray = {p.relative_to(REPO).as_posix() for p in PACKAGE.rglob("*")
             if (p.name.startswith("cpu_") or p.name == "csrc") and home not in p.parents}
    assert stray == set()
    assert (home / "csrc").is_dir()


ENGINES_HOME = PACKAGE / "policy" / "engines"


def test_every_engine_lives_in_policy_engines():
    """``policy/engine.py`` is the engine contract; each engine is one package ``policy/engines/<name>/``: its
    ``engine.py`` holds the engine class (the one module that defines a class deriving from an ``*Engine``), its
    ``__init__.py`` registers it and imports the engine module only inside a function. No ``*_engine.py`` module
    lives anywhere else."""
    stray = {p.relative_to(REPO).as_posix() for p in PACKAGE.rglob("*_engine.py") if ENGINES_HOME not in p.parents}
    assert stray == set()
    names = sorted(p.parent.name for p in ENGINES_HOME.glob("*/__init__.py"))
    assert names, "no engine package under policy/engines/"
    defining = {p.relative_to(REPO).as_posix() for p in PACKAGE.rglob("*.py")
                if any(isinstance(n, ast.ClassDef) and any(ast.unparse(b).endswith("Engine") for b in n.bases)
                       for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))))}
    assert defining == {f"ziprl/policy/engines/{name}/engine.py" for name in names}
    found = imports()
    for name in names:
        eager = [i.name for i in found[f"ziprl/policy/engines/{name}/__init__.py"]
                 if not i.lazy and i.name.startswith(f"ziprl.policy.engines.{name}.")]
        assert eager == [], name


def test_the_rllib_adapter_lives_in_integrations():
    """The RLlib adapter (a module named ``tokenized``/``rllib``, or one defining its env or env creator) is
    ``integrations/rllib.py`` and nothing else."""
    names = {"TokenizedSearchCompressEnv", "make_tokenized_env", "HeuristicCandidates"}
    home = "ziprl/integrations/rllib.py"
    defining = {p.relative_to(REPO).as_posix() for p in PACKAGE.rglob("*.py")
                if p.stem in ("tokenized", "rllib") or names & {n.name for n in ast.walk(ast.parse(p.read_text()))
                                                                if isinstance(n, ast.ClassDef | ast.FunctionDef)}}
    assert defining == {home}


DEV_DEPENDENCIES = frozenset({"hypothesis", "pytest"})


def test_nothing_in_ziprl_imports_its_testing_helpers():
    """``ziprl/testing/`` is the top layer: it may import any layer, and no module outside it imports it. Its
    ``__init__.py`` imports nothing, and only its modules import a dev dependency, so ``import ziprl`` (or
    ``ziprl.testing``) never loads hypothesis."""
    assert {f for f in importers("ziprl.testing") if not f.startswith("ziprl/testing/")} == set()
    assert LAYERS["testing/"].may_import == set(LAYERS) - {"testing/", ENTRY, ROOT}
    assert file_imports(PACKAGE / "testing" / "__init__.py") == []
    dev = {f for f, found in imports().items() if any(i.name.split(".")[0] in DEV_DEPENDENCIES for i in found)}
    assert {f for f in dev if not f.startswith("ziprl/testing/")} == set()
    code = "import sys, ziprl, ziprl.testing; print(sorted(m for m in ('hypothesis', 'pytest') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO).stdout
    assert out.strip() == "[]"


def test_ray_is_imported_only_under_actors_and_the_commands_that_start_it():
    outside = {f for f, found in imports().items() if any(i.name.split(".")[0] == "ray" for i in found)
               and not f.startswith("ziprl/actors/")}
    assert outside <= RAY_COMMANDS, sorted(outside - RAY_COMMANDS)


def test_every_entry_point_runs_its_command():
    for shim in ENTRY_POINTS:
        tree = ast.parse((REPO / shim).read_text(encoding="utf-8"))
        (target,) = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert target.startswith("ziprl.cli."), shim
        assert (REPO / (target.replace(".", "/") + ".py")).is_file(), shim


# the names the weight-transfer contract (ziprl/weights/) replaced: none may come back
OLD_WEIGHT_NAMES = ("WeightPush", "InProcessPush", "WeightSync", "ObjectStoreSync", "CollectiveSync", "SendsWeights",
                    "ReceivesWeights", "WeightSource", "GroupMember", "WeightRef", "WeightSyncExtension",
                    "make_weight_sync", "join_weight_transfer", "receive_weight_transfer", "vllm_nccl", "ziprl_group",
                    "weight_sync", "weight_buckets")
WEIGHTS = PACKAGE / "weights"


def test_the_old_weight_transfer_names_are_gone():
    found = [f"{p.relative_to(REPO)}: {name}" for p in sorted(PACKAGE.rglob("*.py")) for name in OLD_WEIGHT_NAMES
             if re.search(rf"\b{name}\b", p.read_text(encoding="utf-8"))]
    assert found == []


def test_the_weight_transfer_vocabulary_is_four_names_named_in_the_doc():
    tree = ast.parse((WEIGHTS / "__init__.py").read_text(encoding="utf-8"))
    public = [n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef) and not n.name.startswith("_")]
    assert public == ["WeightSender", "WeightReceiver", "LearnerWeights", "Transport"]
    section = DOC.read_text(encoding="utf-8").split("## Weight transfer", 1)[1].split("\n## ", 1)[0]
    assert [n for n in public if f"`{n}`" not in section] == []


def test_actors_reach_the_weight_transfer_only_through_its_contract():
    """actors/ only wires Ray: of ``ziprl.weights`` it imports the contract's names, never a transport's module."""
    internals = [f"{rel}:{i.line}: {i.name}" for rel, found in imports().items() if rel.startswith("ziprl/actors/")
                 for i in found if i.name.startswith("ziprl.weights.")
                 and (WEIGHTS / f"{i.name.split('.')[2]}.py").is_file()]
    assert internals == []
