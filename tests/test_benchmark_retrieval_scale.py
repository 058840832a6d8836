"""benchmarks/retrieval_scale.py: ``--work`` is a directory the benchmark marked with its own kind, or a new one, and
``--n`` and ``--queries`` are checked when the arguments are parsed; bad input exits 2 and changes no file."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from ziprl.outputs import write_marker
from ziprl.testing.outputs import digests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _common  # noqa: E402
import retrieval_scale  # noqa: E402

WORKER = {"build": {"build_s": 1.0, "build_peak_mb": 50.0},
          "search": {"recall@10_real": 1.0, "recall@10_synthetic": 0.9, "qps_b16": 90.0, "qps_b64": 100.0,
                     "load_mb": 10.0, "resident_mb": 12.0, "own_mb": 8.0, "mapped_mb": 4.0, "index_file_mb": 3.0,
                     "vectors_file_mb": 0.0, "passages_file_mb": 1.0}}


def refuse(*args, **kwargs):
    raise AssertionError("retrieval_scale worked on input it should have refused")


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """Results and the cache under ``tmp_path``; running a worker fails the test."""
    monkeypatch.setattr(_common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(retrieval_scale, "RESULTS", tmp_path / "results")
    monkeypatch.setenv("ZIPRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "argv", ["benchmarks/retrieval_scale.py"])
    monkeypatch.setattr(retrieval_scale, "run_worker", refuse)
    return tmp_path


@pytest.fixture
def no_data(bench, monkeypatch):
    """:func:`bench`, and making data fails the test too."""
    monkeypatch.setattr(retrieval_scale, "make_data", refuse)
    return bench


def users_dir(path: Path, marker: str | None = None) -> Path:
    """A directory holding a corpus and vectors of the user's (marked ``marker`` when given)."""
    path.mkdir()
    (path / "corpus.jsonl").write_text('{"id": "mine", "title": "t", "text": "mine"}\n')
    np.save(path / "vectors.npy", np.eye(2, dtype=np.float32))
    if marker:
        write_marker(path, marker)
    return path


KIND = "bench-retrieval_scale"


@pytest.mark.parametrize("marker", [None, "run", "bench"])  # "bench": learning.py's working directory
def test_a_work_directory_the_benchmark_did_not_mark_exits_2_unchanged(no_data, capsys, marker):
    work = users_dir(no_data / "mine", marker)
    before = digests(work)
    assert retrieval_scale.main(["--work", str(work), "--n", "2000"]) == 2
    assert "error: --work: " in capsys.readouterr().err
    assert digests(work) == before


@pytest.mark.parametrize(("argv", "said"), [
    (["--n", "10"], "--n 10: the corpus holds the sample's 2000 real passages"),
    (["--quick", "--queries", "0"], "--queries 0: give at least 1"),
    (["--n", "2000", "--sweep", "8"], "--sweep searches the indexes of the last run"),
])
def test_bad_arguments_exit_2_before_the_work_directory_is_touched(no_data, capsys, argv, said):
    work = users_dir(no_data / "work", KIND)
    before = digests(work)
    with pytest.raises(SystemExit) as exc:
        retrieval_scale.main(["--work", str(work), *argv])
    assert exc.value.code == 2
    assert said in capsys.readouterr().err
    assert digests(work) == before
    assert not (no_data / "cache").exists()


def test_data_of_another_size_is_refused_not_reused(bench, capsys):
    work = bench / "work"
    write_marker(work, KIND)
    (work / "data.json").write_text(json.dumps({"n": 5000, "synthetic_queries": 500}))
    before = digests(work)
    assert retrieval_scale.main(["--work", str(work), "--n", "3000"]) == 2
    assert "holds the data of --n 5000 --queries 500" in capsys.readouterr().err
    assert digests(work) == before


@pytest.mark.parametrize("record", ['{"n": 3000}', '{"n": "3000", "synthetic_queries": 500}', "[3000, 500]", "{"])
def test_a_data_record_that_does_not_say_its_size_exits_2_naming_it_unchanged(no_data, capsys, record):
    work = no_data / "work"
    write_marker(work, KIND)
    (work / "data.json").write_text(record)
    before = digests(work)
    assert retrieval_scale.main(["--work", str(work), "--n", "3000"]) == 2
    err = capsys.readouterr().err
    assert f"error: --work: {work / 'data.json'} is not the data record this benchmark writes" in err
    assert "pass another --work" in err and "Traceback" not in err
    assert digests(work) == before


class StubEncoder:
    """Query vectors without a model: unit 384-dim rows."""

    def encode_queries(self, questions: list[str]) -> np.ndarray:
        x = np.random.default_rng(0).normal(size=(len(questions), retrieval_scale.DIM)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_a_run_marks_its_work_directory_and_a_rerun_reuses_its_data(bench, monkeypatch):
    import ziprl.retrieval.encoder

    monkeypatch.setattr(ziprl.retrieval.encoder, "Encoder", StubEncoder)
    monkeypatch.setattr(retrieval_scale, "run_worker", lambda kind, *args: WORKER[kind])
    argv = ["--n", "2100", "--queries", "4", "--configs", "flat", "--sharded", "none"]
    assert retrieval_scale.main(argv) == 0
    work = bench / "cache" / "bench" / "retrieval_scale-2100"
    meta = json.loads((work / "data.json").read_text())
    assert (meta["n"], meta["real_passages"], meta["synthetic_queries"]) == (2100, retrieval_scale.REAL_PASSAGES, 4)
    assert np.load(work / "vectors.npy", mmap_mode="r").shape == (2100, retrieval_scale.DIM)
    assert json.loads((work / ".ziprl-run").read_text())["kind"] == KIND
    vectors = os.stat(work / "vectors.npy")
    assert retrieval_scale.main(argv) == 0
    assert os.stat(work / "vectors.npy").st_mtime_ns == vectors.st_mtime_ns
    rows = json.loads((bench / "results" / "retrieval_scale.json").read_text())["rows"]
    assert [(r["config"], r["shards"], r["qps_vs_flat"]) for r in rows] == [("flat", 1, 1.0)]
    assert (bench / "results" / "retrieval_scale.png").read_bytes()[:4] == b"\x89PNG"
