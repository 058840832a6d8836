"""Conditions of the machine are the user's to fix (issue 46, item 3): a full disk, a read-only file system or a NUL
byte in a path exits 2 with the path and what to do, never as an internal error."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from ziprl.boundary import UserError, run_command
from ziprl.testing.viewer_data import write_run
from ziprl.view import command as view

FIXES = {
    errno.ENOSPC: "No space left on device; free some disk space or choose a location on another disk",
    errno.EDQUOT: "Disk quota exceeded; free some space within your disk quota or choose a location on another disk",
    errno.EROFS: "Read-only file system; the file system is read-only: choose a writable location",
}


@pytest.mark.parametrize("code", sorted(FIXES))
def test_a_failed_write_inside_a_command_names_the_path_and_the_fix(code, tmp_path, monkeypatch, capsys):
    run_dir, out = write_run(tmp_path / "run", n=2, steps=1), tmp_path / "report.html"

    def fail(self, data):
        raise OSError(code, os.strerror(code), str(self))

    monkeypatch.setattr(Path, "write_bytes", fail)
    assert view.main([str(run_dir), "--out", str(out), "--tokenizer", "none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path}{os.sep}")  # the temp file beside the report
    assert err.endswith(f": {FIXES[code]}\n")
    assert not out.exists()


def test_a_library_that_only_names_the_condition_is_a_user_error(capsys):
    @run_command
    def saves(argv):  # as safetensors reports a full disk: no OSError, the system's words in its text
        raise RuntimeError("Error while serializing: IoError(Os { code: 28, message: \"No space left on device\" })")

    assert saves([]) == 2
    assert capsys.readouterr().err == ('error: Error while serializing: IoError(Os { code: 28, message: "No space left '
                                       'on device" }); free some disk space or choose a location on another disk\n')


def test_a_nul_byte_in_a_path_is_a_user_error(tmp_path, capsys):
    @run_command
    def opens(argv):
        open(argv[0]).close()

    assert opens([str(tmp_path / "a\0b")]) == 2
    assert capsys.readouterr().err == ("error: a path holds a NUL byte (\\0); remove it from the path (check the "
                                       "arguments and the config's paths)\n")


def test_a_user_error_keeps_its_message_when_it_names_a_condition(capsys):
    @run_command
    def refuses(argv):
        raise UserError("--out x is on a Read-only file system; give another --out")

    assert refuses([]) == 2
    assert capsys.readouterr().err == "error: --out x is on a Read-only file system; give another --out\n"


def test_a_long_message_is_shortened_and_keeps_its_fix(capsys):
    @run_command
    def refuses(argv):
        raise UserError(f"question {'q' * 1_000_000} is too long; shorten it")

    assert refuses([]) == 2
    err = capsys.readouterr().err
    assert len(err) < 300
    assert err.endswith("...(1000000 chars) is too long; shorten it\n")
    words = [f"w{i}" for i in range(200_000)]
    assert run_command(lambda argv: (_ for _ in ()).throw(UserError(" ".join(words) + "; the fix")))([]) == 2
    err = capsys.readouterr().err
    assert len(err) < 1200
    assert err.endswith(" w199999; the fix\n")
    assert "chars cut)" in err
