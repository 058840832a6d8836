"""``python -m ziprl.launch --address auto`` with no running Ray cluster: one ``error:`` line naming the fix, exit
code 2, and its ``--out`` left unused, so a plain rerun starts there; with ``--overwrite``, the run there is kept."""

from __future__ import annotations

import functools
import signal

import pytest

from ziprl.cli.launch import main
from ziprl.outputs import used

services = pytest.importorskip("ray._private.services")


@pytest.fixture
def no_cluster(monkeypatch):
    """No Ray cluster to find, whatever else runs on this machine (Ray's own lookup for ``auto``)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "_cached_find_gcs_addresses", functools.cache(frozenset))  # no gcs_server process
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir=None: None)  # nor a `ray start` one


def _snapshot(path) -> dict:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("existing", [False, True], ids=["new", "empty"])
def test_no_cluster_at_address_auto_is_one_error_line_and_leaves_out_unused(tmp_path, capsys, no_cluster, existing):
    import ray

    out = tmp_path / "run"
    if existing:
        out.mkdir()
    for _ in range(2):  # the rerun meets the same directory, not a "not empty" refusal
        code = main(["--address", "auto", "--out", str(out), "--steps", "1"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, err
        assert len(err) == 1 and err[0].startswith("error: no running Ray cluster at --address auto"), err
        assert "ray start --head" in err[0] and "drop --address" in err[0], err
        assert not ray.is_initialized()
        assert not out.is_dir() or not used(out), _snapshot(out)
        assert not (out / "config.json").exists()


def test_no_cluster_is_found_before_overwrite_deletes_the_run_there(tmp_path, capsys, no_cluster):
    from ziprl.rundir import prepare_run_dir

    out = tmp_path / "run"
    prepare_run_dir(out, resume=False, overwrite=False)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    before = _snapshot(out)
    handler = signal.getsignal(signal.SIGTERM)
    assert main(["--address", "auto", "--out", str(out), "--steps", "1", "--overwrite"]) == 2
    assert "no running Ray cluster at --address auto" in capsys.readouterr().err
    assert _snapshot(out) == before
    assert signal.getsignal(signal.SIGTERM) is handler  # not ray.init's


def test_a_joined_cluster_is_left_when_the_run_directory_is_refused(tmp_path, capsys, monkeypatch):
    """Joined first; meanwhile another run wrote into the directory, so the claim refuses it: the command
    disconnects from the cluster before it exits 2."""
    from ziprl.actors import ray_utils

    out, calls = tmp_path / "run", []

    def join(cfg):
        calls.append("joined")
        out.mkdir()
        (out / "metrics.jsonl").write_text('{"step": 1}\n')  # another run, started while this one joined

    monkeypatch.setattr(ray_utils, "init_ray", join)
    monkeypatch.setattr(ray_utils, "stop_ray", lambda local=True: calls.append(("left", local)))
    assert main(["--address", "auto", "--out", str(out), "--steps", "1"]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert calls == ["joined", ("left", False)]


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_an_address_that_takes_no_connection_is_one_error_line_at_once(tmp_path, capsys, monkeypatch, scheme):
    """Ray itself retries such an address for minutes (over 200 s measured), so it is never handed one."""
    import ray

    joins = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: joins.append(kwargs) or ray_never_answers())
    out = tmp_path / "run"
    address = f"{scheme}127.0.0.1:{_closed_port()}"
    assert main(["--address", address, "--out", str(out), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: no Ray cluster reachable at --address {address} ("), err
    assert "drop --address" in err[0], err
    assert joins == []
    assert not out.exists()


def ray_never_answers():
    raise ConnectionError("Ray retried for minutes")
