"""Bad arguments of the speed and system benchmarks (benchmarks/prefix_attention.py, cpu_kernels.py, ray_system.py,
checkpoint_write.py, weight_sync.py, engine_throughput.py, cpu_engines.py, index_build.py, vs_trl.py, gpu_step.py,
gpu_checkpoint.py): each exits 2 with one error naming the argument before any work, and leaves the results it would
write as they were."""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
RESULTS = BENCH / "results"
NEVER = "never_written"  # the results name given to the scripts that take one
sys.path.insert(0, str(BENCH))

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: --device cuda is fine here")
CASES = [  # (script, argv, what stderr says)
    ("prefix_attention", ["--repeats", "0"], "argument --repeats: '0': must be at least 1"),
    ("prefix_attention", ["--threads", "0"], "argument --threads: '0': must be at least 1"),
    ("cpu_kernels", ["--seq", "0", "--threads", "1"], "argument --seq: '0': must be at least 1"),
    ("cpu_kernels", ["--threads", "x"], "argument --threads: 'x' is not an integer"),
    ("cpu_kernels", ["--model", "/nonexistent/model"], "--model /nonexistent/model: not a directory"),
    ("ray_system", ["--parts", "z"], "argument --parts: 'z': use letters of a (retrieval), b (push), c (rollouts)"),
    ("ray_system", ["--cpus", "0"], "argument --cpus: '0': must be at least 1"),
    ("ray_system", ["--cpus", "1", "--max-actors", "4", "--parts", "b"], "give at most 3, or raise --cpus"),
    ("ray_system", ["--cpus", "2", "--retriever-cpus", "3", "--parts", "a"], "give at most 2, or raise --cpus"),
    ("checkpoint_write", ["--gb", "nan"], "argument --gb: 'nan': must be at least 0.001"),
    ("checkpoint_write", ["--rounds", "0"], "argument --rounds: '0': must be at least 1"),
    ("checkpoint_write", ["--pause", "inf"], "argument --pause: 'inf': give a finite number"),
    ("weight_sync", ["--bucket-mb", "inf"], "argument --bucket-mb: 'inf': give a finite number"),
    ("checkpoint_write", ["--dir", "/proc"], "--dir /proc: cannot write there"),
    ("weight_sync", ["--receivers", "x"], "argument --receivers: 'x' is not an integer"),
    ("weight_sync", ["--max-gb", "0"], "--max-gb 0: every setting needs more memory"),
    ("weight_sync", ["--sizes", "bogus"], "argument --sizes: unknown 'bogus'; choose from 0.1B, 0.5B, 1.5B, 135M"),
    ("weight_sync", ["--transports", "nccl"], "argument --transports: unknown 'nccl'"),
    ("engine_throughput", ["--threads", "-1"], "argument --threads: '-1': must be at least 0"),
    pytest.param("engine_throughput", ["--arch", "tiny", "--device", "cuda"],
                 "--device cuda: no CUDA GPU is visible to PyTorch here; use --device cpu or auto", marks=no_cuda),
    ("engine_throughput", ["--arch", "tiny", "--prompt-tokens", "9000"], "longer than the 8192 positions"),
    ("gpu_checkpoint", ["--tokenizer", "/nonexistent"], "--tokenizer /nonexistent: not a directory"),
    ("cpu_engines", ["--threads", "-1"], "argument --threads: '-1': must be at least 0"),
    ("cpu_engines", ["--batches", "x"], "argument --batches: 'x' is not an integer"),
    ("cpu_engines", ["--candidates", "hf,bogus"], "argument --candidates: unknown 'bogus'"),
    ("cpu_engines", ["--modes", "beam"], "argument --modes: unknown 'beam'; choose from greedy, sample"),
    ("index_build", ["--repeats", "0"], "argument --repeats: '0': must be at least 1"),
    ("index_build", ["--n", "0"], "argument --n: '0': must be at least 1"),
    ("vs_trl", ["--rounds", "0"], "argument --rounds: '0': must be at least 1"),
    ("vs_trl", ["--engines", "hf,nope"], "each side is an engine name"),
    ("gpu_step", ["--steps", "0", "--questions", "0"], "must be at least 1"),
    ("gpu_step", ["--prompt-spread", "1.5"], "argument --prompt-spread: '1.5': must be between 0 and 1"),
]
NAME_FLAG = {"prefix_attention": "--name", "cpu_kernels": "--name", "checkpoint_write": "--name",
             "weight_sync": "--name", "engine_throughput": "--name", "cpu_engines": "--out", "vs_trl": "--out",
             "gpu_step": "--name"}  # ray_system.py and index_build.py write their default results only


def results_of(script: str) -> dict[str, str]:
    """The script's results (every file under benchmarks/results named after it) -> sha256."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(RESULTS.glob(f"{script}*"))
            if p.is_file()}


@pytest.mark.parametrize(("script", "argv", "message"), CASES)
def test_a_bad_argument_exits_2_naming_it_before_any_work_and_writes_no_results(script, argv, message, capsys,
                                                                                 monkeypatch):
    module = importlib.import_module(script)
    monkeypatch.setattr(sys, "argv", [str(BENCH / f"{script}.py"), *argv])  # whose results a results name checks
    name = [NAME_FLAG[script], NEVER] if script in NAME_FLAG else []
    before = results_of(script)
    try:
        code = module.main([*argv, *name])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2
    assert message in err
    assert "Traceback" not in err
    assert out == ""  # nothing measured, nothing said about a GPU
    assert results_of(script) == before
    assert not list(RESULTS.glob(f"{NEVER}*"))
