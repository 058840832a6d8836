"""One error boundary for every command: bad input is one line naming the problem, exit code 2, no traceback,
and it is found before any model loads (issue 14, item 5)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ziprl.boundary import UserError, one_line, run_command
from ziprl.cli import demos, index, launch, sft, train
from ziprl.cli import eval as eval_cmd
from ziprl.cli import watch_teacher as demo

GOOD = [{"id": "a", "title": "A", "text": "alpha"}, {"id": "b", "title": "B", "text": "beta"}]


def jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def safetensors(path: Path, truncate: bool = False) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    data = struct.pack("<Q", len(header)) + header + b"\0" * 8
    path.write_bytes(data[:-4] if truncate else data)


def checkpoint_run(root: Path, damage: str) -> Path:
    """A run directory whose `latest` checkpoint is damaged as named."""
    ck = root / "checkpoints" / "step_1-abcd1234"
    ck.mkdir(parents=True)
    for name in ("model", "optimizer", "rng"):
        safetensors(ck / f"{name}.safetensors", truncate=damage == "truncated" and name == "model")
    (ck / "state.json").write_text("{not json" if damage == "bad_state" else "{}")
    (root / "checkpoints" / "latest").write_text("step_9-00000000\n" if damage == "dangling" else ck.name + "\n")
    return root


def cases(d: Path) -> dict[str, tuple]:
    """name -> (command's main, argv); built lazily inside tmp_path."""
    jsonl(d / "good.jsonl", GOOD)
    (d / "malformed.jsonl").write_text('{"id": "a", "title": "A", "text": "x"}\n{oops\n')
    jsonl(d / "dup.jsonl", [GOOD[0], GOOD[0]])
    (d / "empty.jsonl").write_text("")
    (d / "latin1.jsonl").write_bytes(json.dumps(GOOD[0]).replace("alpha", "caf\\u00e9").encode().replace(b"\\u00e9", b"\xe9") + b"\n")
    (d / "garbage_model").mkdir()
    (d / "garbage_model" / "config.json").write_text("<html>not a config</html>")
    (d / "garbage_model" / "model.safetensors").write_bytes(b"\x00" * 100)
    (d / "latin1.yaml").write_bytes(b"env:\n  strategy: caf\xe9\n")
    (d / "busy").mkdir()
    (d / "busy" / "metrics.jsonl").write_text("{}\n")
    for damage in ("dangling", "truncated", "bad_state"):
        checkpoint_run(d / damage, damage)
    import numpy as np

    nan = np.zeros((2, 384), np.float32)
    nan[1, 0] = np.nan
    np.save(d / "nan.npy", nan)
    out = ["--out", str(d / "fresh")]
    corpus = lambda name: ["--set", f"retriever.corpus={d / name}"]  # noqa: E731
    return {
        "eval malformed corpus": (eval_cmd.main, corpus("malformed.jsonl")),
        "eval duplicate-id corpus": (eval_cmd.main, corpus("dup.jsonl")),
        "eval missing corpus": (eval_cmd.main, corpus("nope.jsonl")),
        "eval missing dataset": (eval_cmd.main, ["--dataset", str(d / "nope.jsonl")]),
        "eval unknown dataset": (eval_cmd.main, ["--dataset", "nosuchset"]),
        "eval missing index_dir": (eval_cmd.main, ["--set", f"retriever.index_dir={d / 'noindex'}"]),
        "eval nonexistent model": (eval_cmd.main, ["--model", str(d / "nomodel")]),
        "eval garbage model": (eval_cmd.main, ["--model", str(d / "garbage_model")]),
        "eval top_k above corpus size": (eval_cmd.main, [*corpus("good.jsonl"), "--top-k", "5"]),
        "demos missing dataset": (demos.main, ["--datasets", str(d / "nope.jsonl"), "--out", str(d / "x.parquet")]),
        "demos non-UTF-8 corpus": (demos.main, [*corpus("latin1.jsonl"), "--out", str(d / "x.parquet")]),
        "train empty corpus": (train.main, [*out, *corpus("empty.jsonl")]),
        "train missing sft checkpoint": (train.main, [*out, "--sft-checkpoint", str(d / "nosft")]),
        "train resume dangling latest": (train.main, ["--out", str(d / "dangling"), "--resume"]),
        "train resume truncated safetensors": (train.main, ["--out", str(d / "truncated"), "--resume"]),
        "train resume bad state.json": (train.main, ["--out", str(d / "bad_state"), "--resume"]),
        "train resume nothing": (train.main, ["--out", str(d / "fresh2"), "--resume"]),
        "train non-empty out": (train.main, ["--out", str(d / "busy")]),
        "train negative lr": (train.main, [*out, "--set", "learner.lr=-1"]),
        "launch missing dataset": (launch.main, [*out, "--set", f"data.dataset={d / 'nope.jsonl'}"]),
        "launch non-UTF-8 YAML": (launch.main, [*out, "--config", str(d / "latin1.yaml")]),
        "eval non-UTF-8 YAML": (eval_cmd.main, ["--config", str(d / "latin1.yaml")]),
        "sft missing demos": (sft.main, ["--demos", str(d / "nope.parquet"), "--out", str(d / "sft")]),
        "sft demos is a directory": (sft.main, ["--demos", str(d / "busy"), "--out", str(d / "sft")]),
        "index build missing corpus": (index.main, ["build", "--corpus", str(d / "nope.jsonl"), "--out", str(d / "i")]),
        "index search missing index": (index.main, ["search", "--index", str(d / "noindex"), "q"]),
        "eval bad YAML in --set": (eval_cmd.main, ["--set", "env.max_turns=[1"]),
        "eval YAML tag in --set": (eval_cmd.main, ["--set", "env.max_turns=!!python/object/apply:os.getcwd []"]),
        "eval --out is a file": (eval_cmd.main, ["--out", str(d / "good.jsonl")]),
        "eval --out under a file": (eval_cmd.main, ["--out", str(d / "good.jsonl" / "sub")]),
        "index build IVF on too few vectors": (index.main, ["build", "--corpus", str(d / "good.jsonl"), "--out",
                                                           str(d / "i"), "--index", "IVF4096,Flat", "--no-progress"]),
        "index build NaN embeddings": (index.main, ["build", "--corpus", str(d / "good.jsonl"), "--out", str(d / "i"),
                                                    "--embeddings", str(d / "nan.npy"), "--no-progress"]),
    }


def _names() -> list[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return list(cases(Path(d)))


NEEDLES = {  # what each message must say (the problem and, where there is one, the fix)
    "eval malformed corpus": "line 2: malformed JSON", "eval duplicate-id corpus": "duplicate id 'a'",
    "eval missing corpus": "does not exist; pass the path", "eval missing dataset": "does not exist; pass a dataset",
    "eval unknown dataset": "unknown dataset 'nosuchset'; use one of", "eval missing index_dir": "rebuild it with",
    "eval nonexistent model": "is not a local directory", "eval garbage model": "config.json is not valid JSON",
    "eval top_k above corpus size": "set env.top_k <= 2", "demos missing dataset": "does not exist; pass a dataset",
    "demos non-UTF-8 corpus": "re-encode the file as UTF-8", "train empty corpus": "is empty",
    "train missing sft checkpoint": "drop --sft-checkpoint", "train resume dangling latest": "missing or incomplete",
    "train resume truncated safetensors": "truncated", "train resume bad state.json": "state.json is not valid JSON",
    "train resume nothing": "holds no run to resume", "train non-empty out": "pass --resume to continue",
    "train negative lr": "learner.lr must be > 0", "launch missing dataset": "does not exist; pass a dataset",
    "launch non-UTF-8 YAML": "save it as UTF-8", "eval non-UTF-8 YAML": "save it as UTF-8",
    "sft missing demos": "write one with", "sft demos is a directory": "is a directory; pass the demo Parquet file", "index build missing corpus": "does not exist",
    "index search missing index": "rebuild it with",
    "eval bad YAML in --set": "env.max_turns: not valid YAML (line 1, column 3: expected ',' or ']'",
    "eval YAML tag in --set": "YAML tag !!python/object/apply:os.getcwd is not allowed",
    "eval --out is a file": "exists and is not a directory; an eval report is written into a directory",
    "eval --out under a file": "good.jsonl is a file, not a directory",
    "index build IVF on too few vectors": "trains on 2 vectors but needs >= 4096 (its IVF lists); use a smaller nlist",
    "index build NaN embeddings": "nan.npy row 1 is not finite (NaN or inf)",
}


@pytest.mark.parametrize("name", _names())
def test_bad_input_is_one_line_exit_2(name, tmp_path, monkeypatch, capsys, no_models):
    monkeypatch.chdir(tmp_path)
    main, argv = cases(tmp_path)[name]
    assert main(argv) == 2, name
    err = capsys.readouterr().err.strip()
    last = err.splitlines()[-1]  # progress bars (index building) may come first
    assert last.startswith("error: "), err
    assert err.count("error") == 1, err
    assert "Traceback" not in err, err
    assert NEEDLES[name] in last, last


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(Exception, match="nosuchset"):
        eval_cmd.main(["--dataset", "nosuchset", "--debug"])


def test_an_argument_that_is_not_utf8_is_refused_before_the_command_runs(capsys):
    """Bytes that are not UTF-8 (Python's lone surrogates) could be written into no marker, result or Parquet path:
    one line naming the argument, exit 2, and the command never starts."""
    ran = []

    @run_command
    def command(argv):
        ran.append(argv)

    assert command(["--out", "runs/\udcffx"]) == 2
    err = capsys.readouterr().err
    assert err == "error: argument 2 ('runs/\\xffx') is not UTF-8 text; nothing was done: give paths and text in UTF-8\n"
    assert ran == []
    assert command(["--out", "runs/\u00e9\U0001f600"]) == 0 and ran == [["--out", "runs/\u00e9\U0001f600"]]


def test_a_bug_is_exit_1_and_one_line(capsys):
    @run_command
    def broken(argv):
        raise RuntimeError("boom\nsecond line")

    assert broken([]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--debug" in err
    assert "boom second line" in err


@pytest.mark.parametrize("exc", [KeyError("k"), ValueError("v"), OSError("o"), IndexError("i"), TypeError("t")])
def test_bare_errors_from_inside_are_bugs_not_the_users_fault(exc, capsys):
    @run_command
    def broken(argv):
        raise exc

    assert broken([]) == 1
    assert capsys.readouterr().err.startswith(f"internal error ({type(exc).__name__})")


def test_path_errors_name_the_path_and_the_fix(tmp_path, capsys):
    @run_command
    def opens(argv):
        open(argv[0]).close()

    assert opens([str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nope'}: No such file or directory; check the path\n"
    assert opens([str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path}: Is a directory; pass a file, not a directory\n"


def test_every_command_is_behind_the_boundary():
    for main in (demo.main, demos.main, eval_cmd.main, index.main, launch.main, train.main, sft.main):
        assert getattr(main, "__wrapped__", None) is not None, main.__module__


def test_entry_point_prints_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ziprl.demos", "--datasets", str(tmp_path / "nope.jsonl")],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ")
    assert "Traceback" not in proc.stderr


def test_errors_of_resumed_state_are_the_users_to_fix(tmp_path):
    """A broken checkpoint or an empty question set exits 2 with its message, never as an internal error."""
    from ziprl.boundary import UserError
    from ziprl.learner.checkpoint import CheckpointError, verify_checkpoint
    from ziprl.loop.stream import QuestionStream

    (tmp_path / "ck").mkdir()
    with pytest.raises(CheckpointError, match="lacks model.safetensors") as broken:
        verify_checkpoint(tmp_path / "ck")
    with pytest.raises(UserError, match="question set is empty") as empty:
        QuestionStream([])
    for exc in (broken.value, empty.value):
        assert run_command(lambda argv, exc=exc: (_ for _ in ()).throw(exc))([]) == 2


def test_an_error_a_ray_actor_raised_is_told_by_its_own_message():
    """Ray re-raises an actor's error as a RayTaskError that is also an instance of it (``cause``: the error), and
    whose text is Ray's whole traceback dump: the line is the actor's error's own message."""

    class Actor(UserError):
        pass

    class RayTaskErrorLike(Actor):  # what ray.exceptions.RayTaskError.as_instanceof_cause builds
        def __init__(self, cause):
            super().__init__("ray::LearnerRank.load() (pid=1)\n  File ...\n" + str(cause))
            self.cause = cause

    assert one_line(RayTaskErrorLike(Actor("checkpoint c does not fit this model"))) == \
        "checkpoint c does not fit this model"


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_damaged_converted_default_model_is_named_before_the_run_directory_is_written(tmp_path, monkeypatch, capsys,
                                                                                      no_models, command):
    """A kill or a full disk cut the cached conversion short: the run refused it only after writing its config.json,
    and the rerun was then told to pass --resume (which found no checkpoint)."""
    from ziprl.policy import models

    target = tmp_path / "cache" / "models" / f"{models.DEFAULT_MODEL_NAME}-{models.gguf_hash(models.default_gguf_path())}"
    target.mkdir(parents=True)
    (target / "config.json").write_text('{"model_type": "llama"}')
    safetensors(target / "model.safetensors", truncate=True)
    monkeypatch.setenv("ZIPRL_CACHE", str(tmp_path / "cache"))
    main = {"train": train.main, "eval": eval_cmd.main}[command]
    out = tmp_path / "run"
    for _ in range(2):  # the rerun is told the same, not "pass --resume"
        assert main(["--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"the converted default model in {target} is damaged" in err[0], err
        assert f"delete {target} and run again" in err[0], err
        assert not out.exists() or sorted(p.name for p in out.iterdir()) in ([], [".ziprl-lock"]), list(out.iterdir())
