"""DESIGN.md's layering, checked: the env and scoring layers import neither torch nor Ray, Ray is imported only
under ``ziprl/actors/`` (and the commands that start it), and no library module imports a command."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ziprl"
RAY_COMMANDS = {"ziprl/cli/launch.py"}  # the commands that may start Ray themselves
# `python -m ziprl.<command>`: the stable entry points, each a 3-line module calling ziprl.cli.<module>.main
ENTRY_POINTS = {"ziprl/demos.py", "ziprl/eval.py", "ziprl/index.py", "ziprl/launch.py",
                "ziprl/sft.py", "ziprl/train.py", "ziprl/view/__main__.py", "ziprl/watch_teacher.py"}


def imports() -> dict[str, set[str]]:
    """Every module each file under ziprl/ imports, at top level or inside a function."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        found[path.relative_to(PACKAGE.parent).as_posix()] = names
    return found


def importers(prefix: str) -> set[str]:
    return {f for f, names in imports().items() if any(n == prefix or n.startswith(prefix + ".") for n in names)}


def test_env_and_scoring_import_neither_torch_nor_ray():
    code = ("import importlib, pkgutil, sys\n"
            "for pkg in ('ziprl.scoring', 'ziprl.env'):\n"
            "    root = importlib.import_module(pkg)\n"
            "    for m in pkgutil.walk_packages(root.__path__, pkg + '.'):\n"
            "        importlib.import_module(m.name)\n"
            "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))\n"
            "print(len([m for m in sys.modules if m.startswith(('ziprl.env.', 'ziprl.scoring.'))]))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=PACKAGE.parent).stdout.split("\n")
    assert out[0] == "[]"
    assert int(out[1]) >= 20  # every submodule was imported, not just the packages


def test_ray_is_imported_only_under_actors_and_the_commands_that_start_it():
    outside = {f for f in importers("ray") if not f.startswith("ziprl/actors/")}
    assert outside <= RAY_COMMANDS, sorted(outside - RAY_COMMANDS)


def test_only_commands_reach_the_ray_actors():
    outside = {f for f in importers("ziprl.actors") if not f.startswith(("ziprl/actors/", "ziprl/cli/"))}
    assert outside == set(), sorted(outside)


def test_the_library_never_imports_a_command():
    outside = {f for f in importers("ziprl.cli") if not f.startswith("ziprl/cli/")}
    assert outside == ENTRY_POINTS


def test_every_entry_point_runs_its_command():
    for shim in ENTRY_POINTS:
        tree = ast.parse((PACKAGE.parent / shim).read_text(encoding="utf-8"))
        (target,) = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert (PACKAGE.parent / (target.replace(".", "/") + ".py")).is_file(), shim
