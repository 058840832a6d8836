"""The tests mirror the package: ``tests/<path>/test_<module>[_<aspect>].py`` tests ``ziprl/<path>/<module>.py`` (or
the package ``ziprl/<path>/<module>/``), e.g. ``tests/policy/engines/hf/test_engine.py`` tests
``ziprl/policy/engines/hf/engine.py`` and ``tests/env/test_search_env_fuzz.py`` fuzzes ``ziprl/env/search_env.py``.
The few top-level files that test something across the package (every command, a script, a benchmark) are listed
in ``CROSS_CUTTING``. Helpers that two test files (or the benchmarks) share live in ``ziprl/testing/``, fixtures in
``conftest.py``; a test file imports no other.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "ziprl"
CROSS_CUTTING = {  # top-level test files that mirror no one module: what each covers
    "test_adversarial_commands.py": "hostile command lines for every command (docs/bad-commands.md)",
    "test_bad_commands.py": "bad command lines for every command; `python -m tests.test_bad_commands` writes the doc",
    "test_input_bounds.py": "huge, odd or oversized input in every command",
    "test_learning_gate.py": "the production update path learns (ziprl.train end to end)",
    "test_layering.py": "the import layering of every module",
    "test_tree.py": "this file: the tests mirror the package",
    "test_gpu.py": "the GPU-only tests (scripts/gpu_check.sh)",
    "test_gpu_check.py": "scripts/gpu_check.sh without a GPU",
    "test_gpu_scripts.py": "scripts/gpu_learn.sh and scripts/gpu_payload.sh",
    "test_data_scripts.py": "scripts/make_invented.py, scripts/make_sample.py and scripts/viewer_demo_run.py",
    "test_setup_script.py": "scripts/setup.sh's checks before it installs anything",
    "test_cluster_yaml.py": "cluster/a100x8.yaml",
    "test_one_step_example.py": "examples/one_step.py",
    "test_benchmark_common.py": "benchmarks/_common.py",
    "test_benchmark_arguments_speed.py": "bad arguments of the speed and system benchmarks: exit 2 before any work",
    "test_benchmark_arguments_learning.py": "bad arguments of the learning, scoring and retrieval benchmarks",
    "test_benchmark_hrr_vs_grpo.py": "benchmarks/hrr_vs_grpo.py",
    "test_benchmark_gpu_step.py": "benchmarks/gpu_step.py",
    "test_benchmark_hrr_credit.py": "benchmarks/hrr_credit.py",
    "test_benchmark_gpu_async.py": "benchmarks/gpu_async.py",
    "test_benchmark_launch_time.py": "benchmarks/launch_time.py",
    "test_benchmark_learner_packing.py": "benchmarks/learner_packing.py",
    "test_benchmark_learning.py": "benchmarks/learning.py and benchmarks/learning_compare.py",
    "test_benchmark_qcom_shift.py": "benchmarks/qcom_shift.py",
    "test_benchmark_retrieval_scale.py": "benchmarks/retrieval_scale.py",
    "test_benchmark_scale_sim.py": "benchmarks/scale_sim.py",
    "test_results_index.py": "benchmarks/README.md indexes benchmarks/results/",
}


def modules(package: Path) -> set[str]:
    """The names of the modules and subpackages directly in ``package``."""
    return ({p.stem for p in package.glob("*.py") if p.stem != "__init__"}
            | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()})


def mirrored(test: Path) -> str | None:
    """The module of ``ziprl/`` that ``test`` names (the longest that its name starts with), or None."""
    package = PACKAGE / test.parent.relative_to(TESTS)
    name = test.stem.removeprefix("test_")
    found = [m for m in modules(package) if name == m or name.startswith(f"{m}_")] if package.is_dir() else []
    return max(found, key=len) if found else None


def test_every_test_file_names_a_module_of_its_package():
    stray = [p.relative_to(TESTS).as_posix() for p in sorted(TESTS.rglob("test_*.py"))
             if mirrored(p) is None and p.relative_to(TESTS).as_posix() not in CROSS_CUTTING]
    assert stray == [], "name each after the module it tests (tests/<path>/test_<module>.py), or list it above"


def test_the_cross_cutting_files_exist_and_mirror_no_module():
    assert [f for f in CROSS_CUTTING if not (TESTS / f).is_file()] == []
    assert [f for f in CROSS_CUTTING if mirrored(TESTS / f) is not None] == []


def test_every_test_folder_is_a_package_of_ziprl():
    """Each folder under tests/ mirrors a package of ziprl/ and is a package itself, so basenames may repeat."""
    folders = [p for p in TESTS.rglob("*") if p.is_dir() and not p.name.startswith((".", "__"))]
    assert [p.relative_to(TESTS).as_posix() for p in folders if not (PACKAGE / p.relative_to(TESTS)).is_dir()] == []
    assert [p.relative_to(TESTS).as_posix() for p in folders if not (p / "__init__.py").is_file()] == []


def test_tests_hold_only_tests_and_fixtures():
    """Helpers live in ``ziprl/testing/`` (which the benchmarks import too), fixtures in ``conftest.py``."""
    others = [p.relative_to(TESTS).as_posix() for p in sorted(TESTS.rglob("*.py"))
              if p.name not in ("__init__.py", "conftest.py") and not p.name.startswith("test_")]
    assert others == []


def test_no_test_file_imports_another():
    """A test file imports from ``tests`` only ``tests.conftest`` (and itself, to run a worker in a subprocess):
    helpers two files share live in ``ziprl/testing/``."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        own = ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            found += [f"{path.relative_to(TESTS).as_posix()}: {n}" for n in names
                      if n.split(".")[0] == "tests" and n not in ("tests.conftest", own)]
    assert found == []


def test_every_file_that_starts_ray_is_marked_ray_cluster():
    """Under the README's `-n 2`, modules marked ``ray_cluster`` run one at a time in one worker (conftest.py): an
    unmarked one could start a second 2-CPU cluster beside a running one."""
    unmarked = [p.relative_to(TESTS).as_posix() for p in sorted(TESTS.rglob("test_*.py"))
                if "ray.init(" in (text := p.read_text(encoding="utf-8")) and "pytest.mark.ray_cluster" not in text]
    assert unmarked == []
