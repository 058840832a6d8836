"""Two demos runs on one ``--out``: the second is refused while the first holds its lock, a finishing run replaces
neither a file nor a progress file another wrote meanwhile, and the temporary files a killed run left are removed by
the next run, and nothing else is."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ziprl import outputs
from ziprl.cli.demos import main
from ziprl.env import demos
from ziprl.outputs import OutputError
from ziprl.retrieval.datasets import write_qa_jsonl
from ziprl.retrieval.types import QAExample

QUESTIONS = [QAExample("q1", "Where is Paris?", ["France"], ["Paris"]),
             QAExample("q2", "Who is Ed Wood?", ["a filmmaker"], ["Ed Wood"]),
             QAExample("q3", "Who is Scott Derrickson?", ["a director"], ["Scott Derrickson"])]


@pytest.fixture
def command(tmp_path, monkeypatch, word_retriever):
    """``flags -> exit code`` of ``ziprl.demos`` on three questions, on the word retriever, writing ``d.parquet``."""
    qa = write_qa_jsonl(QUESTIONS, tmp_path / "qa" / "qa.jsonl")
    real = demos.build_demos
    monkeypatch.setattr("ziprl.cli.demos.build_demos",
                        lambda cfg, **kw: real(cfg, retriever=word_retriever, progress=False, **kw))
    return lambda *flags: main(["--datasets", str(qa), "--limit", "0", "--out", str(tmp_path / "d.parquet"), *flags])


def _cfg(tmp_path: Path, *more: str):
    from ziprl.config import load_config

    qa = write_qa_jsonl(QUESTIONS, tmp_path / "qa" / "qa.jsonl")
    return load_config(None, [f"demos.datasets={qa}", "demos.limit=0", f"demos.out={tmp_path / 'd.parquet'}", *more])


def test_a_second_command_on_the_same_out_is_refused_naming_the_holder(tmp_path, command, capsys):
    """While a run holds ``--out`` (here this process), the command exits 2 with one line naming it, writes nothing
    and deletes nothing (not a stopped run's progress, with --overwrite); once it ends, the command runs and
    removes its lock file."""
    out, partial = tmp_path / "d.parquet", demos.partial_path(tmp_path / "d.parquet")
    demos.write_partial(demos.DemoProgress(), partial, {})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with outputs.hold(out):
        for flags in (["--overwrite"], ["--resume"]):
            assert command(*flags) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"is in use by process {os.getpid()}" in err, err
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before | {
            outputs.lock_path(out).name: f"{os.getpid()}\n".encode()}
    assert not os.path.lexists(outputs.lock_path(out))
    assert command("--overwrite") == 0 and demos.is_demos_file(out)
    assert not partial.exists() and not os.path.lexists(outputs.lock_path(out))


def test_a_lock_left_by_a_killed_run_is_taken_over_and_a_users_file_of_its_name_is_kept(tmp_path, command, capsys):
    lock = outputs.lock_path(tmp_path / "d.parquet")
    lock.write_text("999999999\n")  # a killed run's: nobody holds it
    assert command() == 0 and not lock.exists()
    lock.write_text("my notes\n")
    assert command("--overwrite") == 2
    assert "is not a lock file ZipRL wrote" in capsys.readouterr().err
    assert lock.read_text() == "my notes\n"


def test_a_lock_file_its_holder_removed_before_it_was_locked_is_opened_again(tmp_path, monkeypatch):
    """The holder ends (removing its lock file) between this process's open and flock: this process locks the new
    file a third one would open, not the removed one."""
    out, real = tmp_path / "d.parquet", outputs._open_lock
    opened = []

    def racing(path):
        fd = real(path)
        if not opened:
            path.unlink()
        opened.append(fd)
        return fd

    monkeypatch.setattr(outputs, "_open_lock", racing)
    with outputs.hold(out):
        assert len(opened) == 2 and outputs.lock_path(out).read_text() == f"{os.getpid()}\n"
    assert not os.path.lexists(outputs.lock_path(out))


def test_a_killed_runs_temporary_files_are_removed_and_nothing_else(tmp_path, command, capsys):
    """Temporaries of ``d.parquet`` and of its progress file (``.<name>.<8 hex>.tmp``, empty or begun as Parquet)
    are removed by the next run; a user's files of similar names, or of that name but other content, are kept."""
    stale = [".d.parquet.0123abcd.tmp", ".d.parquet.partial.89abcdef.tmp"]
    kept = [".d.parquet.0123abc.tmp", ".d.parquet.0123ABCD.tmp", ".d.parquet.0123abcd.tmp.bak", "d.parquet.0123abcd.tmp",
            ".e.parquet.0123abcd.tmp", ".d.parquet.x.0123abcd.tmp", ".d.parquet.deadbeef.tmp"]
    (tmp_path / stale[0]).write_bytes(b"PAR1\x15\x04")  # killed in the middle of the Parquet write
    (tmp_path / stale[1]).write_bytes(b"")  # killed before its first byte
    for name in kept:
        (tmp_path / name).write_bytes(b"PAR1 mine" if name != ".d.parquet.deadbeef.tmp" else b"my notes")
    (tmp_path / ".d.parquet.feedf00d.tmp").symlink_to(tmp_path / kept[0])
    assert command() == 0
    assert f"removed {tmp_path / stale[0]}" in capsys.readouterr().out
    assert not any(os.path.lexists(tmp_path / name) for name in stale)
    assert all((tmp_path / name).is_file() for name in kept) and (tmp_path / ".d.parquet.feedf00d.tmp").is_symlink()


def test_a_successful_resume_removes_the_temporary_files_of_the_run_it_continues(tmp_path, command, monkeypatch):
    """Killed while writing its progress: the progress file, and its temporary beside it; ``--resume`` finishes and
    leaves neither."""
    from ziprl import paths

    real = paths.atomic_path

    def killed(path):  # the progress file written, then the process killed in the middle of the next write
        if demos.partial_path(tmp_path / "d.parquet").exists():
            tmp = Path(path).with_name(f".{Path(path).name}.0badc0de.tmp")
            tmp.write_bytes(b"PAR1")
            raise SystemExit("killed")  # as a SIGKILL, before atomic_path could remove its temporary
        return real(path)

    monkeypatch.setattr(demos, "atomic_path", killed)
    with pytest.raises(SystemExit):
        command("--set", "demos.checkpoint_every=1")
    monkeypatch.setattr(demos, "atomic_path", real)
    temp = tmp_path / ".d.parquet.partial.0badc0de.tmp"
    assert temp.exists()
    assert command("--resume", "--set", "demos.checkpoint_every=1") == 0
    assert not temp.exists() and not demos.partial_path(tmp_path / "d.parquet").exists()
    assert demos.is_demos_file(tmp_path / "d.parquet")


def test_a_build_never_replaces_an_out_another_process_wrote_while_it_played(tmp_path, word_retriever):
    """The demos stay in the progress file, with every question played; once the other file is moved away,
    ``resume`` writes them without playing again."""
    cfg = _cfg(tmp_path)
    out = Path(cfg.demos.out)

    def other_writes():
        if not out.exists():
            demos.write_demos([], out)  # another run, with no rows

    with pytest.raises(OutputError, match="was written by another process"):
        demos.build_demos(cfg, retriever=word_retriever, progress=False, stop=other_writes)
    assert demos.is_demos_file(out) and _rows(out) == []  # theirs, kept
    saved = demos.read_partial(demos.partial_path(out), demos.demo_settings(cfg, demos.demo_examples(cfg)))
    assert saved.done == len(QUESTIONS) and saved.rows
    out.rename(tmp_path / "theirs.parquet")
    path, counts = demos.build_demos(cfg, retriever=word_retriever, progress=False, resume=True)
    assert _rows(path) == saved.rows and counts["kept"] == len(QUESTIONS)


def test_a_build_keeps_a_progress_file_another_run_wrote_while_it_played(tmp_path, word_retriever):
    cfg = _cfg(tmp_path, "demos.checkpoint_every=0")
    partial = demos.partial_path(cfg.demos.out)

    def other_stops():
        if not partial.exists():
            demos.write_partial(demos.DemoProgress(), partial, {"theirs": 1})

    demos.build_demos(cfg, retriever=word_retriever, progress=False, stop=other_stops)
    assert demos.is_demos_file(Path(cfg.demos.out)) and demos.is_partial_file(partial)


def test_a_periodic_save_never_replaces_a_progress_file_another_run_wrote(tmp_path, word_retriever):
    """With a save after every question, the other run's progress file written after the first save is kept: the
    build stops, naming it, instead of writing over it and deleting it at the end."""
    cfg = _cfg(tmp_path, "demos.checkpoint_every=1")
    partial = demos.partial_path(cfg.demos.out)
    calls = []

    def other_writes_after_the_first_save():
        calls.append(1)
        if len(calls) == 1:
            demos.write_partial(demos.DemoProgress(), partial, {"theirs": 1})

    with pytest.raises(OutputError, match="written by another process"):
        demos.build_demos(cfg, retriever=word_retriever, progress=False, stop=other_writes_after_the_first_save)
    theirs = json.loads(pq.read_schema(partial).metadata[demos.PROGRESS_KEY])
    assert theirs["settings"] == {"theirs": 1} and theirs["done"] == 0


def _rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()
