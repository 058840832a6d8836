"""Bad viewer inputs: each is one ``error:`` line naming the problem and the fix, exit code 2, nothing written.

Bad trajectory files beside good ones are skipped with a warning naming the file; with no good file it is an error.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ziprl.env.trajectory import SCHEMA, save_trajectories
from ziprl.testing.viewer_data import trajectory, write_run
from ziprl.view import command as view
from ziprl.view.data import Run, Source, ViewerError, build_index, episode, load_run, step_stats
from ziprl.view.page import render_page
from ziprl.view.server import make_server
from ziprl.view.tokens import make_decoder


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "run", n=4, steps=2)


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def fails(capsys, monkeypatch):
    """Run the command; assert exit code 2, nothing on stdout and exactly one ``error:`` line; return it.

    A command that gets as far as serving fails the test instead of serving forever.
    """
    from http.server import ThreadingHTTPServer

    def refuse(server):
        raise AssertionError(f"the command started serving on {server.server_address}")

    def run(argv: list[str]) -> str:
        with monkeypatch.context() as m:
            m.setattr(ThreadingHTTPServer, "serve_forever", refuse)
            assert view.main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "", err
        assert err.startswith("error: "), err
        assert err.count("\n") == 1, err
        return err

    return run


# --- the command line -------------------------------------------------------------------------------------------

def test_out_is_a_directory(run_dir, tmp_path, fails):
    (tmp_path / "reports").mkdir()
    before = listing(tmp_path)
    err = fails([str(run_dir), "--out", str(tmp_path / "reports")])
    assert "is a directory" in err
    assert "report.html" in err
    assert listing(tmp_path) == before


def test_out_under_a_regular_file(run_dir, tmp_path, fails):
    (tmp_path / "afile").write_text("keep me")
    before = listing(tmp_path)
    err = fails([str(run_dir), "--out", str(tmp_path / "afile" / "sub" / "r.html")])
    assert "afile" in err
    assert "not a directory" in err
    assert listing(tmp_path) == before
    assert (tmp_path / "afile").read_text() == "keep me"


def test_out_in_a_read_only_directory(run_dir, tmp_path, fails):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        err = fails([str(run_dir), "--out", str(ro / "new" / "r.html")])
        assert "cannot write" in err
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


def test_out_where_nobody_can_write(run_dir, fails):
    target = Path("/sys/ziprl-view-report.html")
    err = fails([str(run_dir), "--out", str(target)])
    assert "cannot write" in err
    assert "/sys" in err
    assert not target.exists()


def test_out_refuses_to_overwrite_a_file_that_is_not_html(run_dir, fails):
    victim = run_dir / "trajectories" / "step_000001.parquet"
    data = victim.read_bytes()
    err = fails([str(run_dir), "--out", str(victim)])
    assert "not an HTML file" in err
    assert victim.read_bytes() == data


def test_out_is_checked_before_the_run_is_read(run_dir, tmp_path, fails, monkeypatch):
    def fail(*_a, **_k):
        raise AssertionError("the run was read before --out was checked")

    monkeypatch.setattr(view, "load_run", fail)
    (tmp_path / "reports").mkdir()
    fails([str(run_dir), "--out", str(tmp_path / "reports")])


def test_out_writes_the_report_and_an_html_file_is_replaced(run_dir, tmp_path):
    out = tmp_path / "new" / "r.html"
    assert view.main([str(run_dir), "--out", str(out), "--tokenizer", "none"]) == 0
    assert 'id="ziprl-episodes"' in out.read_text()
    assert view.main([str(run_dir), "--out", str(out), "--tokenizer", "none", "--overwrite"]) == 0
    assert listing(tmp_path / "new") == ["r.html"]


@pytest.mark.parametrize("content", [b"\xff\xfe garbage \x00", b'{"not": "a tokenizer"}', b""])
def test_tokenizer_garbage(run_dir, tmp_path, fails, content):
    bad = tmp_path / "tok"
    bad.mkdir()
    (bad / "tokenizer.json").write_bytes(content)
    for spec in (bad, bad / "tokenizer.json"):
        err = fails([str(run_dir), "--tokenizer", str(spec), "--out", str(tmp_path / "r.html")])
        assert "tokenizer.json" in err
        assert "--tokenizer none" in err
    assert not (tmp_path / "r.html").exists()


def test_tokenizer_missing(run_dir, tmp_path, fails):
    err = fails([str(run_dir), "--tokenizer", str(tmp_path / "nope"), "--out", str(tmp_path / "r.html")])
    assert "no tokenizer.json" in err
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("host", ["not a host", "", "127.0.0.1; rm -rf /", "http://127.0.0.1"])
def test_host_that_is_not_an_address(run_dir, fails, host):
    err = fails([str(run_dir), "--host", host, "--port", "0"])
    assert "--host" in err
    assert "127.0.0.1" in err


@pytest.mark.parametrize("port", ["70000", "-1", "65536"])
def test_port_out_of_range(run_dir, fails, port):
    assert "--port must be in 0..65535" in fails([str(run_dir), "--port", port])


def test_port_in_use(run_dir, fails):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        err = fails([str(run_dir), "--port", str(port), "--tokenizer", "none"])
    assert f"port {port} is in use" in err
    assert "--port 0" in err


def test_ipv6_loopback_is_served(run_dir):
    server = make_server(load_run(run_dir), host="::1", port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://[::1]:{server.server_address[1]}/api/episode/0"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200
            assert json.load(r)["id"] == 0
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_run_path_missing_empty_or_not_parquet(tmp_path, fails):
    out = tmp_path / "r.html"
    err = fails([str(tmp_path / "missing"), "--out", str(out)])
    assert "neither a trajectory Parquet file nor a run directory" in err
    (tmp_path / "empty").mkdir()
    assert "no trajectory Parquet files" in fails([str(tmp_path / "empty"), "--out", str(out)])
    (tmp_path / "notes.txt").write_text("hello")
    err = fails([str(tmp_path / "notes.txt"), "--out", str(out)])
    assert "notes.txt" in err
    assert "not a readable Parquet file" in err
    assert "ziprl.train" in err
    assert not out.exists()


# --- bad trajectory files ---------------------------------------------------------------------------------------

def _table(**columns) -> pa.Table:
    """The trajectory table of two episodes with some columns replaced (None drops one)."""
    table = pa.Table.from_pylist([dict(vars(trajectory(i))) | {"turns": [vars(t) for t in trajectory(i).turns]}
                                  for i in range(2)], schema=SCHEMA)
    for name, values in columns.items():
        table = table.drop_columns([name]) if name in table.column_names else table
        if values is not None:
            table = table.append_column(name, values)
    return table


def _bad_files(traj: Path) -> dict[str, str]:
    """Write bad trajectory files into ``traj``; name -> what the warning says about it."""
    good = (traj / "step_000001.parquet").read_bytes()
    (traj / "step_000003.parquet").write_bytes(good[: len(good) // 2])  # truncated
    (traj / "step_000004.parquet").write_bytes(os.urandom(4096))  # random bytes
    pq.write_table(_table(turns=pa.array(["x", "y"])), traj / "step_000005.parquet")
    pq.write_table(_table(reward=pa.array(["high", "low"])), traj / "step_000006.parquet")
    pq.write_table(_table(question=None), traj / "step_000007.parquet")
    level_as_text = pa.array([[{"level": "3", "response_text": "x"}], []],
                             pa.list_(pa.struct([("level", pa.string()), ("response_text", pa.string())])))
    pq.write_table(_table(turns=level_as_text), traj / "step_000008.parquet")
    (traj / "step_000009.parquet").mkdir()  # a directory named like a file: not a trajectory file, not listed
    return {"step_000003.parquet": "not a readable Parquet file", "step_000004.parquet": "not a readable Parquet file",
            "step_000005.parquet": "'turns'", "step_000006.parquet": "'reward'",
            "step_000007.parquet": "'question'", "step_000008.parquet": "'level'"}


def test_bad_files_beside_good_ones_are_skipped_with_a_warning(run_dir, tmp_path, capsys):
    bad = _bad_files(run_dir / "trajectories")
    pq.write_table(_table(extra_column=pa.array([1, 2]), em=None), run_dir / "trajectories" / "step_000010.parquet")
    run = load_run(run_dir)
    assert [s.label for s in run.sources] == ["step 1", "step 2", "step 10", "eval adaptive", "eval react"]
    assert {p.name: why for p, why in run.skipped}.keys() == bad.keys()
    for path, why in run.skipped:
        assert bad[path.name] in why
    assert len(build_index(run)["rows"]) == 4 * 2 + 2 + 4 * 2
    assert len(step_stats(run)) == 5
    out = tmp_path / "r.html"
    assert view.main([str(run_dir), "--out", str(out), "--tokenizer", "none"]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("[view] warning: skipped ")]
    assert len(warnings) == len(bad)
    assert all(any(name in w for w in warnings) for name in bad)
    assert "Traceback" not in captured.err
    assert out.is_file()


def test_only_bad_files_is_an_error(tmp_path, fails):
    traj = tmp_path / "run" / "trajectories"
    save_trajectories([trajectory(0)], traj / "step_000001.parquet")
    _bad_files(traj)
    (traj / "step_000001.parquet").write_bytes(b"PAR1 not really")
    before = listing(tmp_path)
    err = fails([str(tmp_path / "run"), "--out", str(tmp_path / "r.html")])
    assert "no readable trajectory file" in err
    assert "7 files" in err
    assert "step_000001.parquet" in err
    assert listing(tmp_path) == before
    with pytest.raises(ValueError, match="no readable trajectory file"):
        load_run(tmp_path / "run")


def test_odd_values_in_a_good_file_are_served(tmp_path):
    """Binary and timestamp per-turn extras, null answers and NaN rewards all reach the page."""
    turn = pa.struct([("response_text", pa.string()), ("action", pa.string()), ("blob", pa.binary()),
                      ("when", pa.timestamp("s")), ("prompt_ids", pa.list_(pa.int32()))])
    schema = pa.schema([("question", pa.string()), ("answers", pa.list_(pa.string())), ("reward", pa.float64()),
                        ("turns", pa.list_(turn))])
    rows = [{"question": "Q?", "answers": [None, "x"], "reward": float("nan"),
             "turns": [{"response_text": "<answer>x</answer>", "action": "answer", "blob": b"\x00\xff", "when": 0,
                        "prompt_ids": [1, 2]}]}]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "odd.parquet")
    run = load_run(tmp_path / "odd.parquet")
    assert build_index(run)["rows"][0][3] == "x"
    assert "00ff" in render_page(run, static=True)
    server = make_server(run, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/api/episode/0", timeout=10) as r:
            body = json.load(r)
        assert body["reward"] is None
        assert body["turns"][0]["extra"]["blob"] == "00ff"
        assert body["turns"][0]["extra"]["when"].startswith("1970-01-01")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_decoder_skips_ids_out_of_range(tmp_path):
    """Prompt ids no tokenizer has (negative, past the vocabulary, past 32 bits) are dropped, not an error."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"Question:": 0, "a": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    ids = [0, -5, 1, 2**40, 7]
    turn = pa.struct([("prompt_ids", pa.list_(pa.int64()))])
    table = pa.table({"question": ["Q?"], "turns": pa.array([[{"prompt_ids": ids}]], pa.list_(turn))})
    pq.write_table(table, tmp_path / "t.parquet")
    run = load_run(tmp_path / "t.parquet")
    run.decode = make_decoder(str(tmp_path), run)
    assert run.decode is not None
    assert run.decode(ids) == "Question: a"
    assert episode(run, 0)["turns"][0]["memory"] is None


def _tokenizer_dir(path: Path) -> Path:
    """A tiny tokenizer.json whose decoded prompts look like ZipRL prompts."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"Question:": 0, "a": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    return path


_NULL_TURN = pa.struct([("prompt_ids", pa.list_(pa.int64())), ("response_text", pa.string())])


@pytest.mark.parametrize("turns, problem", [
    ([[{"prompt_ids": [0, None, 1], "response_text": "x"}]], "'prompt_ids' holds 1 null id"),
    ([[None, {"prompt_ids": [0], "response_text": "x"}]], "'turns' holds 1 null turn"),
    ([[{"prompt_ids": [0], "response_text": "x"}, None]], "'turns' holds 1 null turn"),
])
def test_a_file_with_null_turns_or_null_prompt_ids_is_refused_before_anything_is_written(tmp_path, fails, turns,
                                                                                         problem):
    traj = tmp_path / "run" / "trajectories"
    traj.mkdir(parents=True)
    table = pa.table({"question": ["Q?"], "turns": pa.array(turns, pa.list_(_NULL_TURN))})
    pq.write_table(table, traj / "step_000001.parquet")
    tokenizer = _tokenizer_dir(tmp_path / "tok")
    before = listing(tmp_path)
    for extra in (["--tokenizer", str(tokenizer), "--out", str(tmp_path / "r.html")],
                  ["--tokenizer", "none", "--out", str(tmp_path / "r.html")],
                  ["--tokenizer", str(tokenizer), "--port", "0"]):
        err = fails([str(tmp_path / "run"), *extra])
        assert "step_000001.parquet" in err
        assert problem in err
        assert "ziprl.train" in err
    assert listing(tmp_path) == before
    with pytest.raises(ValueError, match=problem):
        load_run(tmp_path / "run")


def test_a_file_with_null_turns_beside_good_ones_is_skipped_and_the_rest_is_served(run_dir, tmp_path, capsys):
    bad = pa.table({"question": ["Q?"], "turns": pa.array([[None]], pa.list_(_NULL_TURN))})
    pq.write_table(bad, run_dir / "trajectories" / "step_000003.parquet")
    run = load_run(run_dir)
    assert [p.name for p, _ in run.skipped] == ["step_000003.parquet"]
    assert all(episode(run, i)["turns"] for i in range(run.num_episodes))
    out = tmp_path / "r.html"
    assert view.main([str(run_dir), "--out", str(out), "--tokenizer", "none"]) == 0
    assert "null turn" in capsys.readouterr().err
    assert out.is_file()


# --- odd extra columns and names given twice --------------------------------------------------------------------

def _get_episode(run, episode_id: int) -> tuple[int, dict]:
    """Serve ``run`` and GET one episode: the status and the JSON body."""
    server = make_server(run, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/api/episode/{episode_id}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _with_turn_field(name: str, values: pa.Array) -> pa.ChunkedArray:
    """The 'turns' of :func:`_table` with one more per-turn field (``values``: one per turn of both episodes)."""
    turns = _table().column("turns").combine_chunks()
    structs = turns.values
    fields = [structs.field(i) for i in range(structs.type.num_fields)] + [values]
    names = [f.name for f in structs.type] + [name]
    return pa.chunked_array([pa.ListArray.from_arrays(turns.offsets, pa.StructArray.from_arrays(fields, names))])


@pytest.mark.parametrize("column", [pa.array([10**15, 0], pa.timestamp("s")), pa.array([10**18, 1], pa.duration("s")),
                                    pa.array([[10**15], []], pa.list_(pa.date64()))])
def test_an_extra_column_python_cannot_hold_is_left_out(tmp_path, capsys, column):
    """Extra columns are no part of the report, so values out of Python's range in them change nothing."""
    path = tmp_path / "odd.parquet"
    pq.write_table(_table(odd=column), path)
    out = tmp_path / "r.html"
    assert view.main([str(path), "--tokenizer", "none", "--out", str(out)]) == 0
    assert capsys.readouterr().err == ""
    assert out.is_file()
    run = load_run(path)
    assert "odd" not in run.sources[0].table.column_names
    status, body = _get_episode(run, 1)
    assert (status, body["qid"], len(body["turns"])) == (200, "q1", 3)


def test_per_turn_times_python_cannot_hold_are_shown_as_text(tmp_path, capsys):
    whens = pa.array([10**15, 0, None, None, None, None], pa.timestamp("s"))  # two episodes of 3 turns
    path = tmp_path / "odd.parquet"
    pq.write_table(_table(turns=_with_turn_field("when", whens)), path)
    out = tmp_path / "r.html"
    assert view.main([str(path), "--tokenizer", "none", "--out", str(out)]) == 0
    assert capsys.readouterr().err == ""
    assert "value out of range" in out.read_text()
    run = load_run(path)
    first, second = episode(run, 0)["turns"][:2]
    assert first["extra"]["when"] == f"<value out of range: {10**18}>"  # Parquet stores seconds as milliseconds
    assert second["extra"]["when"] == "1970-01-01 00:00:00.000"
    assert first["extra"]["noisy_hits"] == 0
    status, body = _get_episode(run, 1)
    assert (status, body["turns"][0]["extra"]["when"]) == (200, None)


def _action_twice() -> pa.ChunkedArray:
    return _with_turn_field("action", pa.array(["search"] * 6))


def _dup_column() -> pa.Table:
    table = _table()
    return table.append_column("reward", table.column("reward"))


def _nested_dup() -> pa.ChunkedArray:
    pair = pa.StructArray.from_arrays([pa.array(range(6)), pa.array(range(6))], names=["a", "a"])
    return _with_turn_field("pair", pair)


@pytest.mark.parametrize("make, problem", [
    (lambda: _table(turns=_action_twice()), "per-turn field 'action' is given 2 times in 'turns', expected each "
                                             "field once"),
    (_dup_column, "column 'reward' is given 2 times, expected each column once"),
    (lambda: _table(turns=_nested_dup()), "per-turn field 'pair' cannot be shown (Converting to Python dictionary "
                                          "is not supported when duplicate field names are present); drop it from the file"),
])
def test_a_name_given_twice_is_one_error_or_skipped_beside_good_files(run_dir, tmp_path, fails, capsys, make,
                                                                       problem):
    bad = tmp_path / "bad.parquet"
    pq.write_table(make(), bad)
    err = fails([str(bad), "--tokenizer", "none", "--out", str(tmp_path / "r.html")])
    assert f"{bad} is not a ZipRL trajectory file: {problem}" in err
    assert "ziprl.train" in err
    assert not (tmp_path / "r.html").exists()
    bad.rename(run_dir / "trajectories" / "step_000003.parquet")
    run = load_run(run_dir)
    assert [(p.name, why.split(": ", 1)[1]) for p, why in run.skipped] == [("step_000003.parquet", problem)]
    assert run.num_episodes == 4 * 4
    out = tmp_path / "r.html"
    assert view.main([str(run_dir), "--tokenizer", "none", "--out", str(out)]) == 0
    assert capsys.readouterr().err == f"[view] warning: skipped {run_dir}/trajectories/step_000003.parquet: " \
                                      f"not a ZipRL trajectory file: {problem}\n"
    assert out.is_file()
    assert _get_episode(run, 9)[0] == 200


def test_an_episode_whose_row_python_cannot_hold_is_a_422_naming_the_file(tmp_path):
    """The last guard: a table that never went through read_source (values out of Python's range) is a clear error
    per episode, not a crash."""
    turn = pa.struct([("response_text", pa.string()), ("when", pa.timestamp("s"))])
    table = pa.table({"question": ["Q?"], "turns": pa.array([[{"response_text": "x", "when": 10**15}]],
                                                          pa.list_(turn))})
    run = Run("raw", [Source(tmp_path / "raw.parquet", "raw", None, table)])
    with pytest.raises(ViewerError, match=rf"^episode 0 in {tmp_path}/raw.parquet cannot be shown \(Python int too "
                                          r"large to convert to C int\); open the run without that file$"):
        episode(run, 0)
    status, body = _get_episode(run, 0)
    assert status == 422
    assert body == {"error": f"episode 0 in {tmp_path}/raw.parquet cannot be shown (Python int too large to convert "
                             "to C int); open the run without that file"}
