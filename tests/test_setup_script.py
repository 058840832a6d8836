"""scripts/setup.sh installs only into a virtual environment: a ``.venv`` that is not one (a file, a directory
holding another Python, a link to a system tree) is refused, one ``error:`` line and exit 2, before pip runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of the files setup.sh reads, where a fake ``pip`` would show any install."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def setup(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(project / "scripts" / "setup.sh"), *args], capture_output=True, text=True,
                          timeout=60, cwd=project)


@pytest.mark.parametrize("venv", ["a file", "another python", "a link to a system tree"])
def test_a_venv_that_is_not_a_virtual_environment_is_refused_before_any_install(project, tmp_path, venv):
    interpreter = tmp_path / "python-of-yours"
    interpreter.write_text("#!/bin/sh\necho \"$@\" >> \"$(dirname \"$0\")/installs\"\n")
    interpreter.chmod(0o755)
    if venv == "a file":
        (project / ".venv").write_text("notes\n")
    elif venv == "another python":
        (project / ".venv" / "bin").mkdir(parents=True)
        (project / ".venv" / "bin" / "python").symlink_to(interpreter)
    else:
        (tmp_path / "usr" / "bin").mkdir(parents=True)
        (tmp_path / "usr" / "bin" / "python").symlink_to(interpreter)
        (project / ".venv").symlink_to(tmp_path / "usr")
    done = setup(project)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: .venv exists but is not a Python virtual environment"), lines
    assert "move it away" in lines[0]
    assert not (tmp_path / "installs").exists()  # pip never ran


def test_an_unknown_option_is_one_error_line(project):
    done = setup(project, "--bogus")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: unknown option --bogus (known: --llamacpp, --help)"
    assert not os.path.lexists(project / ".venv")


def test_an_up_to_date_virtual_environment_is_taken_as_it_is(project):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(project / ".venv")], check=True)
    stamp = subprocess.run("cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12", shell=True, cwd=project,
                           capture_output=True, text=True, check=True).stdout.strip()
    (project / ".venv" / f".ziprl-setup-{stamp}").touch()
    done = setup(project)
    assert done.returncode == 0, done.stderr
    assert "[setup] .venv is up to date" in done.stdout
