"""Shared test fixtures."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from ziprl.testing.word_retriever import PASSAGES, WordRetriever  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# The data directory of the named sets beyond the shipped ones: $ZIPRL_DATA, else ../shared/data beside the checkout
# when it is there (CI's machines have it), so the tests that read those sets run rather than skip.
SHARED = Path(os.environ.get("ZIPRL_DATA") or REPO.parent / "shared" / "data")
if SHARED.is_dir():
    os.environ.setdefault("ZIPRL_DATA", str(SHARED))


# The README's test command runs two pytest-xdist workers (`-n 2`). Each worker computes with one torch thread, so
# that the two share the cores instead of thrashing them (subprocesses keep their defaults). A test module is one unit
# of work, so its module fixtures (a loaded model, a played rollout) are built once, and every module marked
# `ray_cluster` is in one unit, run one after another: two 2-CPU Ray clusters at once would starve each other.
# Units start longest first, so that no long one is left running alone at the end: the Ray unit, then the modules
# marked `slow`, then the rest (xdist's order: more tests first).
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(1)

RAY_UNIT = "ray_cluster"


@functools.cache
def _marks(path: str) -> tuple[bool, bool]:
    """Whether the test module at ``path`` (relative to the repository) is marked ``ray_cluster``, and ``slow``."""
    text = (REPO / path).read_text(encoding="utf-8")
    return f"pytest.mark.{RAY_UNIT}" in text, "pytest.mark.slow" in text


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent without it
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModuleOrRayScheduling(LoadScopeScheduling):
        """xdist's loadscope, with one scope per test module and one for all modules marked ``ray_cluster``,
        handed out longest first (the Ray unit, the ``slow`` modules, the rest)."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return RAY_UNIT if path.endswith(".py") and _marks(path)[0] else path

        _ordered = False  # the work queue is put in order once, before the first unit goes out

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:
                slow = [s for s in self.workqueue if s != RAY_UNIT and s.endswith(".py") and _marks(s)[1]]
                for scope in reversed([RAY_UNIT, *slow]):
                    if scope in self.workqueue:
                        self.workqueue.move_to_end(scope, last=False)
                self._ordered = True
            super()._assign_work_unit(node)

    return ModuleOrRayScheduling(config, log)


def _cpu_has_bf16() -> bool:
    from ziprl.learner.hardware import cpu_has_bf16

    return cpu_has_bf16()


# A CPU learner with learner.bf16=true is refused where the CPU has no bf16 instructions (an AVX2-only CPU runs bf16
# GEMM at ~0.3 GFLOP/s): tests that ask for it skip there, saying why.
requires_cpu_bf16 = pytest.mark.skipif(not _cpu_has_bf16(),
                                       reason="learner.bf16=true needs a CPU with AVX-512 BF16 or AMX (refused here)")


@pytest.fixture
def word_retriever() -> WordRetriever:
    return WordRetriever(PASSAGES)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as a plain checkpoint (converted once, cached)."""
    from ziprl.config import ModelConfig
    from ziprl.policy.models import resolve_model_path

    return resolve_model_path(ModelConfig())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_model_dir) -> Path:
    """A 2-layer, hidden-64 random Llama with SmolLM2's tokenizer (real token ids, fast steps)."""
    from ziprl.policy.models import build_tiny_llama

    return build_tiny_llama(default_model_dir, tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def no_models():
    """Any model load during a module's tests fails the test: bad input must be found before a model loads."""
    mp = pytest.MonkeyPatch()

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was reported")

    for target in ("ziprl.policy.make_engine", "ziprl.learner.trainer.Trainer.__init__"):
        mp.setattr(target, refuse)
    yield
    mp.undo()


@pytest.fixture
def no_work(no_models, monkeypatch):
    """Beyond ``no_models``: no Ray cluster starts, no encoder loads, no scripted episode is played."""
    def refuse(*args, **kwargs):
        raise AssertionError("work started before the bad input was reported")

    for target in ("ziprl.actors.launch.launch", "ziprl.retrieval.encoder.Encoder.model", "ziprl.env.demos.synthesize"):
        monkeypatch.setattr(target, property(refuse) if target.endswith(".model") else refuse)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Decode steps of a 135M model are tiny: one thread is as fast, and ~10x faster on a busy shared CPU."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


_HOLD = """import sys, pathlib
from ziprl.outputs import locked
with locked(pathlib.Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def lock_holder():
    """``with lock_holder(path) as pid``: another process holds :func:`ziprl.outputs.locked` on ``path`` until the
    block ends."""
    import contextlib
    import subprocess
    import sys

    @contextlib.contextmanager
    def hold(path: Path):
        holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, cwd=REPO)
        try:
            assert holder.stdout.readline() == "held\n"
            yield holder.pid
        finally:
            holder.communicate("")

    return hold


@pytest.fixture
def waiting_for(capsys):
    """``waiting_for(thread, pid)``: stderr until ``thread`` says it waits for process ``pid``, or ends (bounded: a
    failure never hangs the suite)."""

    def wait(thread, pid: int) -> str:
        said = ""
        for _ in range(6000):
            said += capsys.readouterr().err
            if f"waiting for process {pid}" in said or not thread.is_alive():
                break
            thread.join(0.01)
        return said

    return wait
