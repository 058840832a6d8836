"""One output-path rule for every command that writes (issue 46, items 1 and 5): each reproduction refused with
exit code 2 and every file left as it was; paths normalised; links refused; a lock keeps a second process out."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from ziprl.cli import demos as demos_cmd
from ziprl.cli import eval as eval_cmd
from ziprl.cli import index, sft, train
from ziprl.config import load_config
from ziprl.env.demos import is_demos_file, write_demos
from ziprl.evaluation.harness import is_eval_entry
from ziprl.outputs import (
    LOCK,
    MARKER,
    OutputError,
    check_file,
    entries,
    locked,
    own_dir,
    plan_dir,
    read_marker,
    refuse_inputs_inside,
    sweep_leftovers,
)
from ziprl.retrieval.index_build import adopt_index, build_index
from ziprl.retrieval.index_files import RetrieverError
from ziprl.rundir import claim_run_dir, plan_run_dir, prepare_run_dir
from ziprl.testing.local_model import passing_model_dir
from ziprl.testing.outputs import DEMO_ROW, StubEncoder, corpus, digests, fake_checkpoint, vectors
from ziprl.view import command as view

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def work(tmp_path, monkeypatch):
    """An empty working directory, as in the issue's reproductions."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---------------------------------------------------------------- the reproductions


def test_index_build_refuses_a_directory_with_any_manifest(work, capsys):
    (work / "d").mkdir()
    (work / "d" / "manifest.json").write_text("{}\n")
    (work / "d" / "index.html").write_text("x\n")
    corpus(work / "c.jsonl")
    before = digests(work)
    assert index.main(["build", "--corpus", "c.jsonl", "--out", "d"]) == 2
    assert "not a ZipRL index" in capsys.readouterr().err
    assert index.main(["adopt", "--faiss", "c.jsonl", "--corpus", "c.jsonl", "--out", "d"]) == 2
    assert digests(work) == before


def test_sft_refuses_a_directory_it_did_not_make(work, capsys, no_models):
    (work / "p" / "model").mkdir(parents=True)
    (work / "p" / "model" / "code.py").write_text("x\n")
    write_demos([DEMO_ROW], work / "demos.parquet")
    before = digests(work)
    assert sft.main(["--demos", "demos.parquet", "--out", "p"]) == 2
    assert "is not empty (model)" in capsys.readouterr().err
    assert sft.main(["--demos", "demos.parquet", "--out", "p", "--overwrite"]) == 2
    assert "has no .ziprl-run marker" in capsys.readouterr().err
    with pytest.raises(OutputError, match="already holds model"):  # the library function too (Stage 1's callers)
        from ziprl.learner.sft import run_sft

        run_sft(load_config(None, []), work / "demos.parquet", work / "p")
    assert digests(work) == before


def test_train_normalises_the_path_before_checking_it(work, capsys, no_models):
    (work / "proj").mkdir()
    (work / "proj" / "metrics.jsonl").write_text('{"mine":1}\n')
    before = digests(work)
    assert train.main(["--out", "nosuch/../proj"]) == 2
    assert f"{work / 'proj'} is not empty (metrics.jsonl)" in capsys.readouterr().err
    assert digests(work) == before


def test_a_new_path_through_a_missing_folder_is_written_where_it_resolves(work):
    assert plan_run_dir("nosuch/../run", resume=False, overwrite=False).out == work / "run"


def test_a_second_process_is_refused_with_the_holders_pid(work, capsys, no_models, lock_holder):
    with lock_holder(work / "run") as pid:
        assert train.main(["--out", "run"]) == 2
        err = capsys.readouterr().err
        assert f"is in use by process {pid}" in err
        assert sorted(os.listdir(work / "run")) == [LOCK]  # the second one wrote nothing
    with locked(work / "run"):  # released when the holder ended
        pass


@pytest.mark.parametrize("flag", [[], ["--overwrite"], ["--resume"]])
def test_a_used_directory_in_use_is_named_in_use_before_resume_or_overwrite_is_advised(work, capsys, no_models,
                                                                                      lock_holder, flag):
    """A run under way: a second train is told the holder's pid, not to pass --resume or --overwrite."""
    prepare_run_dir(work / "run", resume=False, overwrite=False)
    (work / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    with lock_holder(work / "run") as pid:
        before = digests(work)
        assert train.main(["--out", "run", *flag]) == 2
        err = capsys.readouterr().err
        assert f"is in use by process {pid}" in err and "pass --" not in err
        assert digests(work) == before
    with pytest.raises(OutputError, match="has no checkpoint"):  # the holder gone, the usual advice
        plan_run_dir(work / "run", resume=True, overwrite=False)


def test_a_probe_of_the_lock_does_not_refuse_a_claim(work):
    """refuse_held takes a shared lock for a moment: a claim that meets it waits that moment out instead of naming
    a holder that is not there."""
    import fcntl
    import threading

    with locked(work / "run"):
        pass
    fd = os.open(work / "run" / LOCK, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # the probe's moment
    threading.Timer(0.05, os.close, [fd]).start()
    with locked(work / "run"):
        pass


def test_a_marker_write_cut_short_leaves_a_directory_a_plain_rerun_takes(work, no_models):
    """Killed while its marker was written, a new run left only its lock and the marker's temporary: the rerun
    takes the directory as new and removes that temporary; a user's file of a similar name is content."""
    run = work / "run"
    with locked(run):
        pass
    (run / f".{MARKER}.0123abcd.tmp").write_text('{"format"')
    plan = plan_run_dir(run, resume=False, overwrite=False)
    assert plan.delete == ()
    with claim_run_dir(plan):
        pass
    assert sorted(os.listdir(run)) == sorted([MARKER, LOCK])
    (work / "b").mkdir()
    (work / "b" / f".{MARKER}.backup.tmp").write_text("mine\n")
    with pytest.raises(OutputError, match="is not empty"):
        plan_run_dir(work / "b", resume=False, overwrite=False)


@pytest.mark.parametrize("lock", ["", "\n"])
def test_a_lock_left_empty_by_a_kill_before_its_process_id_counts_as_the_lock(work, no_models, lock):
    """Killed between creating the lock file and writing its id (or on a full disk there): the directory is new."""
    run = work / "run"
    run.mkdir()
    (run / LOCK).write_text(lock)
    assert plan_run_dir(run, resume=False, overwrite=False).delete == ()
    with claim_run_dir(plan_run_dir(run, resume=False, overwrite=False)):
        pass
    assert sorted(os.listdir(run)) == sorted([MARKER, LOCK])
    (work / "b").mkdir()
    (work / "b" / LOCK).write_text("my notes\n")  # a user's file of that name
    with pytest.raises(OutputError, match="is not empty"):
        plan_run_dir(work / "b", resume=False, overwrite=False)


def test_leftovers_of_killed_writes_of_the_outputs_entries_are_swept_and_nothing_else(work):
    owns = entries(r"model(?:/[^/]+)?", r"trajectories(?:/step_\d{6}\.parquet)?")
    out = work / "o"
    (out / "trajectories").mkdir(parents=True)
    (out / ".model.ab_c1234.tmp").mkdir()  # atomic_dir's temporary, with a file
    (out / ".model.ab_c1234.tmp" / "config.json").write_text("{}")
    (out / ".model.old-0123abcd").mkdir()  # replace_dir's old copy
    (out / "trajectories" / ".step_000002.parquet.0123abcd.tmp").write_bytes(b"PAR")
    kept = {".notes.txt.0123abcd.tmp": "not an entry of the output", ".model.old-89abcdef": "a file, not an old copy",
            "trajectories/.step_000003.parquet.backup.tmp": "not a temporary's name",
            ".model.backup01/notes.txt": "a directory of yours, not a temporary's name"}
    for rel in kept:
        (out / rel).parent.mkdir(exist_ok=True)
        (out / rel).write_text("mine\n")
    (out / ".model.linked12.tmp").symlink_to(work)
    removed = sweep_leftovers(out, owns)
    assert sorted(removed) == [".model.ab_c1234.tmp", ".model.old-0123abcd",
                               "trajectories/.step_000002.parquet.0123abcd.tmp"]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == sorted(
        [*kept, ".model.backup01", ".model.linked12.tmp", "trajectories"])


def test_a_library_build_waits_for_the_one_under_way_and_reuses_it(work, lock_holder, waiting_for):
    """The replicas of a retriever deployment all build a missing index: one builds, the others wait for it."""
    import threading

    c, v = corpus(work / "c.jsonl"), vectors(work / "v.npy")
    results: list[object] = []
    with lock_holder(work / "idx") as pid:
        with pytest.raises(OutputError, match=f"in use by process {pid}"):
            build_index(c, work / "idx", StubEncoder(), embeddings=v, progress=False, wait=False)
        waiter = threading.Thread(target=lambda: results.append(
            build_index(c, work / "idx", StubEncoder(), embeddings=v, progress=False)))
        waiter.start()
        waiting_for(waiter, pid)
        assert waiter.is_alive()
    waiter.join()
    assert results == [work / "idx"]
    assert read_marker(work / "idx")["kind"] == "index"


def test_the_directory_is_checked_again_once_the_lock_is_held(work):
    """Both plans pass before either process writes: the one that locks second finds the first one's run."""
    plan = plan_run_dir(work / "run", resume=False, overwrite=False)
    prepare_run_dir(work / "run", resume=False, overwrite=False)
    (work / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    before = digests(work)
    with pytest.raises(OutputError, match="is not empty"), claim_run_dir(plan):
        pytest.fail("the claim went through")
    assert {k: v for k, v in digests(work).items() if k != f"run/{LOCK}"} == before


def test_resume_refuses_a_run_whose_checkpoints_are_a_link(work, capsys, no_models):
    elsewhere = work / "elsewhere"
    fake_checkpoint(elsewhere)
    (elsewhere / ".step_2-dead.tmp1").mkdir()  # what resume's cleaning would have deleted
    prepare_run_dir(work / "run", resume=False, overwrite=False)
    (work / "run" / "metrics.jsonl").write_text("{}\n")
    (work / "run" / "checkpoints").symlink_to(elsewhere, target_is_directory=True)
    before = digests(work)
    assert train.main(["--out", "run", "--resume"]) == 2
    assert "--resume: " in (err := capsys.readouterr().err)
    assert "holds links (checkpoints)" in err
    assert digests(work) == before


def test_resume_refuses_a_hard_link_inside_the_run(work):
    prepare_run_dir(work / "run", resume=False, overwrite=False)
    fake_checkpoint(work / "run" / "checkpoints")
    (work / "mine.jsonl").write_text('{"mine": 1}\n')
    os.link(work / "mine.jsonl", work / "run" / "metrics.jsonl")
    with pytest.raises(OutputError, match=r"holds links \(metrics\.jsonl\)"):
        plan_run_dir(work / "run", resume=True, overwrite=False)
    os.unlink(work / "run" / "metrics.jsonl")
    assert plan_run_dir(work / "run", resume=True, overwrite=False).resume_from == work / "run" / "checkpoints" / "step_1"


@pytest.mark.parametrize("flags", [[], ["--overwrite"], ["--resume"]])
def test_a_marker_that_is_a_directory_says_so(work, capsys, flags, no_models):
    (work / "run" / MARKER).mkdir(parents=True)
    (work / "run" / "metrics.jsonl").write_text("{}\n")
    before = digests(work)
    assert train.main(["--out", "run", *flags]) == 2
    assert f"has a {MARKER} that is a directory, not the marker file" in capsys.readouterr().err
    assert digests(work) == before


def test_overwrite_refuses_to_delete_an_input_the_command_reads(work, capsys, no_models):
    """``--overwrite`` deletes the entries its kind writes, and an input may be one (a model an earlier SFT run wrote,
    a run's trajectories/ given as a model) or lie in one (a demos file put inside model/): the command is refused
    before the delete, naming the input, and every file stays (it used to delete the input, then fail reading it)."""
    from ziprl.learner.sft import SFT_WRITES

    sft_dir = own_dir(work / "s", "sft", SFT_WRITES)
    passing_model_dir(sft_dir / "model")
    write_demos([DEMO_ROW], work / "d.parquet")
    run = work / "run"
    prepare_run_dir(run, resume=False, overwrite=False)
    (run / "trajectories").mkdir()
    ev = own_dir(work / "ev", "eval", ["noise_0.5"])
    (ev / "noise_0.5").mkdir()
    before = digests(work)
    for command, argv, held in (
            (sft, ["--demos", "d.parquet", "--set", "model.path=s/model", "--out", "s", "--overwrite"], "s/model"),
            (train, ["--out", "run", "--overwrite", "--sft-checkpoint", "run/trajectories"], "run/trajectories"),
            (eval_cmd, ["--model", "ev/noise_0.5", "--out", "ev", "--overwrite"], "ev/noise_0.5")):
        assert command.main(argv) == 2
        err = capsys.readouterr().err
        assert f"which holds the input {held}; nothing was deleted" in err, err
        assert digests(work) == before
    write_demos([DEMO_ROW], sft_dir / "model" / "d.parquet")  # inside an entry SFT writes whole
    assert sft.main(["--demos", "s/model/d.parquet", "--out", "s", "--overwrite"]) == 2
    assert "which holds the input s/model/d.parquet; nothing was deleted" in capsys.readouterr().err
    (sft_dir / "model" / "d.parquet").unlink()
    (sft_dir / "model" / "sub").mkdir()  # save_pretrained writes no file in a subdirectory of its own
    (sft_dir / "model" / "sub" / "x").write_text("mine")
    assert sft.main(["--demos", "d.parquet", "--out", "s", "--overwrite"]) == 2
    assert "does not write (model/sub/x); nothing was deleted" in capsys.readouterr().err
    assert (sft_dir / "model" / "sub" / "x").read_text() == "mine"


def test_an_input_outside_what_overwrite_deletes_passes(work):
    refuse_inputs_inside([work / "run" / "checkpoints"], [work / "run" / "checkpoints-old", None, "elsewhere"])
    with pytest.raises(OutputError, match="would delete .*checkpoints, which holds the input run/checkpoints/x"):
        refuse_inputs_inside([work / "run" / "checkpoints"], ["run/checkpoints/x"])


# ---------------------------------------------------------------- kinds


def test_each_command_keeps_to_its_own_kind(work, capsys, no_models):
    prepare_run_dir(work / "run", resume=False, overwrite=False)
    write_demos([DEMO_ROW], work / "demos.parquet")
    before = digests(work)
    assert eval_cmd.main(["--out", "run"]) == 2
    assert "is a train/launch run directory (its .ziprl-run says so), not an eval report directory" in \
        capsys.readouterr().err
    assert sft.main(["--demos", "demos.parquet", "--out", "run", "--overwrite"]) == 2
    assert "not an SFT run directory" in capsys.readouterr().err
    with pytest.raises(OutputError, match="not a retrieval index directory"):
        build_index(corpus(work / "c.jsonl"), work / "run", StubEncoder(), embeddings=vectors(work / "v.npy"))
    assert {k: v for k, v in digests(work).items() if k not in ("c.jsonl", "v.npy")} == before


def test_overwrite_replaces_only_what_its_kind_wrote(work):
    out = own_dir(work / "ev", "eval", ["report.json"])
    (out / "report.json").write_text("{}")
    plan = plan_dir(out, "eval", True, is_eval_entry)
    assert plan.delete == (out / "report.json",)
    (out / "noise_0.5").mkdir()  # a noise sweep's cell, with what it writes
    (out / "noise_0.5" / "trajectories_react.parquet").write_bytes(b"PAR1")
    assert plan_dir(out, "eval", True, is_eval_entry).delete == (out / "noise_0.5", out / "report.json")
    (out / "noise_0.5" / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"entries an eval report does not write \(noise_0\.5/notes\.txt\)"):
        plan_dir(out, "eval", True, is_eval_entry)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"entries an eval report does not write \(notes\.txt\)"):
        plan_dir(out, "eval", True, is_eval_entry)


@pytest.mark.parametrize("marker", ['{"format": 1, "kind": [1]}', '{"format": 1, "kind": null}', "[1]"])
def test_a_marker_of_another_shape_is_no_marker(work, marker, capsys):
    (work / "run").mkdir()
    (work / "run" / MARKER).write_text(marker)
    (work / "run" / "metrics.jsonl").write_text("{}\n")
    assert read_marker(work / "run") is None
    before = digests(work)
    assert train.main(["--out", "run", "--resume"]) == 2
    assert f"has a {MARKER} that is not a ZipRL marker" in capsys.readouterr().err
    assert digests(work) == before


def test_entries_name_what_an_output_writes_deep_inside_and_its_temporary_copies():
    owns = entries("report\\.json", r"shard-\d+(?:/index\.faiss)?")
    assert all(map(owns, ["report.json", ".report.json.0123abcd.tmp", "shard-0", "shard-0/index.faiss",
                          ".shard-0.k2j_h4xz", ".shard-0.k2j_h4xz/anything/inside", "shard-0/.index.faiss.x.tmp"]))
    assert not any(map(owns, ["notes", "shard-0/notes", ".report.json", ".report.json.", "..report.json.x",
                              "report.json/x", ".shard-x.tmp/index.faiss"]))


def test_stage1_cache_writes_demos_then_sft_into_one_directory_and_again_after_a_kill(work):
    """What launch and the benchmarks do in ``stage1_dir``: the demos file, then SFT's model and tb beside it."""
    from ziprl.learner.sft import SFT_WRITES

    root = work / "cache" / "stage1" / "abc"
    for _ in range(2):  # the second time: a killed Stage 1 run again
        write_demos([DEMO_ROW], root / "demos.parquet")
        assert own_dir(root, "sft", SFT_WRITES) == root
        (root / "tb").mkdir(exist_ok=True)
    assert read_marker(root)["kind"] == "sft"


def test_eval_refuses_a_foreign_directory_before_any_model_loads(work, capsys, no_models):
    (work / "ev").mkdir()
    (work / "ev" / "report.md").write_text("my report\n")
    before = digests(work)
    assert eval_cmd.main(["--out", "ev", "--overwrite"]) == 2
    assert "has no .ziprl-run marker" in capsys.readouterr().err
    assert digests(work) == before


# ---------------------------------------------------------------- index directories


def test_index_directories(work):
    c, v = corpus(work / "c.jsonl"), vectors(work / "v.npy")
    out = build_index(c, work / "idx", StubEncoder(), embeddings=v, progress=False)
    assert read_marker(out)["kind"] == "index"
    with pytest.raises(RetrieverError, match="pass --overwrite"):
        build_index(c, out, StubEncoder(), index_type="hnsw", embeddings=v, progress=False)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"does not write \(notes\.txt\)"):
        build_index(c, out, StubEncoder(), index_type="hnsw", embeddings=v, progress=False, overwrite=True)
    (out / "notes.txt").unlink()
    (out / MARKER).unlink()  # an index of a ZipRL older than the marker: reused as it is, never written
    assert build_index(c, out, StubEncoder(), embeddings=v, progress=False) == out
    with pytest.raises(RetrieverError, match="older ZipRL .* delete it yourself"):
        build_index(c, out, StubEncoder(), index_type="hnsw", embeddings=v, progress=False, overwrite=True)
    (work / ".fresh.partial").mkdir()
    (work / ".fresh.partial" / "x").write_text("mine")
    with pytest.raises(RetrieverError, match="no build marked it"):
        build_index(c, work / "fresh", StubEncoder(), embeddings=v, progress=False)
    assert (work / ".fresh.partial" / "x").read_text() == "mine"


def test_adopt_replaces_only_with_overwrite(work):
    import faiss

    flat = faiss.IndexFlatIP(4)
    flat.add(np.eye(3, 4, dtype=np.float32))
    faiss.write_index(flat, str(work / "x.faiss"))
    c = corpus(work / "c.jsonl")
    out = adopt_index(work / "x.faiss", c, work / "idx", StubEncoder(), progress=False)
    assert read_marker(out)["kind"] == "index"
    with pytest.raises(RetrieverError, match="pass --overwrite"):
        adopt_index(work / "x.faiss", c, out, StubEncoder(), progress=False)
    assert adopt_index(work / "x.faiss", c, out, StubEncoder(), progress=False, overwrite=True) == out


# ---------------------------------------------------------------- single files


def test_demos_replaces_only_a_demos_file_and_only_with_overwrite(work, capsys):
    (work / "mine.parquet").write_bytes(b"PAR1 my data")
    before = digests(work)
    assert demos_cmd.main(["--out", "mine.parquet", "--overwrite"]) == 2
    assert "is not a demos file ziprl.demos wrote" in capsys.readouterr().err
    assert digests(work) == before
    path = write_demos([DEMO_ROW], work / "d.parquet")
    assert is_demos_file(path)
    assert not is_demos_file(work / "mine.parquet")
    with pytest.raises(OutputError, match="pass --overwrite"):
        check_file(path, False, is_demos_file, "a demos file", "d.parquet")
    assert check_file(path, True, is_demos_file, "a demos file", "d.parquet") == path
    with pytest.raises(OutputError, match="is not a demos file"):
        write_demos([DEMO_ROW], work / "mine.parquet")  # the library refuses it too
    assert digests(work)["mine.parquet"] == before["mine.parquet"]


def test_view_replaces_only_its_own_report_and_only_with_overwrite(work, capsys):
    from ziprl.testing.viewer_data import write_run

    run = write_run(work / "run", n=2, steps=1)
    assert view.main([str(run), "--out", "r.html", "--tokenizer", "none"]) == 0
    assert view.main([str(run), "--out", "r.html", "--tokenizer", "none"]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert view.main([str(run), "--out", "r.html", "--tokenizer", "none", "--overwrite"]) == 0
    (work / "mine.html").write_text("<html>my page</html>")
    assert view.main([str(run), "--out", "mine.html", "--tokenizer", "none", "--overwrite"]) == 2
    assert "is not a report ziprl.view wrote" in capsys.readouterr().err
    assert (work / "mine.html").read_text() == "<html>my page</html>"
    os.link(work / "r.html", work / "other.html")
    assert view.main([str(run), "--out", "r.html", "--tokenizer", "none", "--overwrite"]) == 2
    assert "file with another name" in capsys.readouterr().err


def test_a_benchmark_work_dir_is_new_or_its_own(tmp_path):
    from ziprl.outputs import work_dir

    out = work_dir(tmp_path / "bench", "bench")
    assert read_marker(out)["kind"] == "bench"
    (out / "w0_seed0").mkdir()
    assert work_dir(out, "bench") == out  # a rerun continues in its own directory
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not known to be a benchmark's working directory"):
        work_dir(foreign, "bench")
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    run = tmp_path / "run"
    prepare_run_dir(run, resume=False, overwrite=False)
    with pytest.raises(OutputError, match="is a train/launch run directory"):
        work_dir(run, "bench")
    os.symlink(foreign, out / "elsewhere")
    with pytest.raises(OutputError, match="elsewhere"):
        work_dir(out, "bench")


def test_a_results_name_never_leaves_the_results_folder(tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import _common

    monkeypatch.setattr(_common, "RESULTS", tmp_path / "results")
    for bad in ("../escape", "a/b", ".hidden", ""):
        with pytest.raises(SystemExit) as stop:
            _common.write_results(bad, [{"a": 1}])
        assert stop.value.code == 2 and "error: results name" in capsys.readouterr().err
    assert not (tmp_path / "escape.json").exists()
    assert not (tmp_path / "results").exists()


def test_a_marker_records_arguments_that_are_not_utf8_escaped(tmp_path, monkeypatch):
    from ziprl.outputs import write_marker

    monkeypatch.setattr(sys, "argv", ["launch.py", "--out", "runs/\udcffx"])
    write_marker(tmp_path, "run")
    assert read_marker(tmp_path)["command"] == "launch.py --out runs/\\xffx"
