"""benchmarks/_common.py: every result file says where it comes from (commit, command, config, machine, date)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def common():
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("_common")
    finally:
        sys.path.remove(str(BENCH))


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_result_files_record_commit_command_config_machine_and_date(common, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(sys, "argv", [str(BENCH / "learning.py"), "--quick", "--out", "/elsewhere/runs/x"])
    config = common.REPO / "configs" / "learn-cpu.yaml"
    js, md = common.write_results("demo", [{"a": 1.5}], {"seeds": [0]}, config=config)
    got = json.loads(js.read_text())
    assert got["rows"] == [{"a": 1.5}]
    assert got["meta"] == {"seeds": [0]}
    assert got["commit"] == common.COMMIT
    assert got["command"] == "python benchmarks/learning.py --quick --out x"
    assert got["config"] == {"path": "configs/learn-cpu.yaml", "text": config.read_text()}
    assert set(got["machine"]) == {"cpu", "cores", "cpu_flags", "max_cpu_isa", "python", "torch", "gpu"}
    assert got["date"][:4].isdigit()
    assert got["date"].endswith("+00:00")
    lines = md.read_text().splitlines()
    assert lines[:5] == [f"- commit: `{common.COMMIT}`", "- command: `python benchmarks/learning.py --quick --out x`",
                         "- config: `configs/learn-cpu.yaml`", lines[3], f"- date: {got['date']}"]
    assert lines[3].startswith("- machine: ")
    assert lines[5:] == ["", "| a |", "|---|", "| 1.5 |"]


def test_a_config_given_as_a_dict_is_recorded_as_given_and_none_as_none(common):
    assert common.provenance({"lr": 1e-5})["config"] == {"lr": 1e-5}
    assert common.provenance()["config"] is None
    assert "- config: `none`" in common.markdown_header(common.provenance())


def test_the_commit_is_the_checkout_head(common):
    assert common.COMMIT.removesuffix("-dirty") == _git(common.REPO, "rev-parse", "HEAD")


def test_the_commit_is_dirty_with_uncommitted_code_but_not_with_new_results(common, tmp_path, monkeypatch):
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "results" / "r.json").write_text("{}\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "c")
    head = _git(tmp_path, "rev-parse", "HEAD")
    monkeypatch.setattr(common, "REPO", tmp_path)
    assert common.git_commit() == head
    (tmp_path / "benchmarks" / "results" / "r.json").write_text('{"new": 1}\n')
    (tmp_path / "untracked.txt").write_text("scratch\n")
    assert common.git_commit() == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert common.git_commit() == f"{head}-dirty"


def test_outside_a_git_checkout_the_commit_is_unknown(common, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "REPO", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert common.git_commit() == "unknown"


def test_machine_names_the_cpu_its_kernel_flags_and_torch(common, monkeypatch):
    import torch

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    m = common.machine()
    assert m["cores"] >= 1
    assert set(m["cpu_flags"]) <= set(common.CPU_FLAGS)
    assert m["torch"] == torch.__version__
    flags = common.cpuinfo().get("flags", "").split()
    assert m["cpu_flags"] == [f for f in common.CPU_FLAGS if f in flags]
    assert m["max_cpu_isa"] is None


def test_a_result_measured_under_an_isa_cap_records_the_capped_flags_and_the_cap(common, monkeypatch):
    monkeypatch.setattr(common, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    m = common.machine()
    assert (m["cpu_flags"], m["max_cpu_isa"]) == (["avx2"], "AVX2")
    prov = {"commit": "c", "command": "x", "config": None, "machine": m, "date": "d"}
    assert "(avx2; capped by ONEDNN_MAX_CPU_ISA=AVX2)" in common.markdown_header(prov)[3]


@pytest.mark.parametrize("bad", ["../x", "/tmp/x", ".hidden", "a/b", ""])
def test_a_results_name_that_is_a_path_is_refused_when_the_arguments_are_parsed(common, bad):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="names files in"):
        common.results_name(bad)
    assert common.results_name("learning_gate_x.1") == "learning_gate_x.1"


def test_every_results_name_option_is_checked_before_the_work():
    """A script's results name (``--name``, or ``--out`` where it names results) is checked by argparse, so a bad one
    exits 2 at once instead of after the benchmark ran (learning_gate.py once ran all its seeds first)."""
    import re

    unchecked = []
    for path in sorted(BENCH.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r'add_argument\("--(name|out)",[^\n]*', text):
            names_results = "results" in m.group(0) or m.group(1) == "name"
            if names_results and not re.search(r"type=(results_name|results_names\(|plots_name\()", m.group(0)):
                unchecked.append(f"{path.name}: {m.group(0)[:80]}")
    assert not unchecked


def test_a_bad_results_name_exits_2_before_any_run(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH / "learning_gate.py"), "--name", "../escape"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert "names files in" in proc.stderr
    assert "[gate]" not in proc.stdout


@pytest.mark.parametrize("flag", ["--set", "--hrr-set"])
def test_a_bad_config_override_of_the_learning_gate_exits_2_before_any_run(tmp_path, flag):
    proc = subprocess.run([sys.executable, str(BENCH / "learning_gate.py"), flag, "learner.hrr_reference=nope"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert f"error: {flag}: learner.hrr_reference must be trajectory or causal, got 'nope'" in proc.stderr
    assert "[gate]" not in proc.stdout and "[hrr]" not in proc.stdout


@pytest.fixture
def results(common, tmp_path, monkeypatch):
    """``RESULTS`` under ``tmp_path``, holding ``gate`` written by learning_gate.py; this process is cpu_engines.py."""
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(sys, "argv", [str(BENCH / "learning_gate.py")])
    common.write_results("gate", [{"passed": True}])
    monkeypatch.setattr(sys, "argv", [str(BENCH / "cpu_engines.py"), "--out", "gate"])
    return tmp_path / "results"


def test_results_another_script_wrote_are_refused_when_the_arguments_are_parsed(common, results, capsys):
    import argparse

    from ziprl.testing.outputs import digests

    before = digests(results)
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=common.results_name)
    with pytest.raises(SystemExit) as exc:
        ap.parse_args(["--out", "gate"])
    assert exc.value.code == 2
    assert "hold the results of learning_gate.py, not of cpu_engines.py" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        common.write_results("gate", [{"tokens_per_s": 1.0}])
    assert exc.value.code == 2
    assert "delete those files yourself to replace them" in capsys.readouterr().err
    assert digests(results) == before


def test_a_script_rewrites_its_own_results_and_older_ones_named_after_it(common, results, monkeypatch):
    (results / "cpu_engines_old.json").write_text(json.dumps({"rows": [], "meta": {}, "machine": {}}))
    common.write_results("cpu_engines_old", [{"a": 1}])
    monkeypatch.setattr(sys, "argv", [str(BENCH / "learning_gate.py")])
    common.write_results("gate", [{"passed": False}])
    assert json.loads((results / "gate.json").read_text())["rows"] == [{"passed": False}]
    assert (json.loads((results / "cpu_engines_old.json").read_text())["command"]
            == "python benchmarks/cpu_engines.py --out gate")


LEGACY = json.dumps({"rows": [{"a": 1}], "meta": {}, "machine": {}})  # results written before the provenance


def test_results_older_than_the_provenance_are_replaced_only_by_the_script_they_are_named_after(common, results,
                                                                                                monkeypatch, capsys):
    """A legacy result (rows, no command) once counted as anyone's: ``checkpoint_write.py --name cpu_kernels``
    replaced cpu_kernels.json. Now only the script it is named after (the longest matching stem) may."""
    import argparse

    from ziprl.testing.outputs import digests

    (results / "weight_sync_old.json").write_text(LEGACY)
    (results / "weight_sync_old.md").write_text("| a |\n")
    (results / "weight_sync_old.png").write_bytes(b"untagged: written before plots were tagged")
    before = digests(results)
    assert common.results_writer("weight_sync_old") == "weight_sync.py"
    with pytest.raises(argparse.ArgumentTypeError, match="hold the results of weight_sync.py, not of cpu_engines.py"):
        common.results_name("weight_sync_old")  # this process: cpu_engines.py
    with pytest.raises(argparse.ArgumentTypeError, match="weight_sync_old.png is not a plot this script wrote"):
        common.check_plots("weight_sync_old")
    with pytest.raises(SystemExit) as exc:
        common.write_results("weight_sync_old", [{"b": 2}])
    assert exc.value.code == 2
    assert digests(results) == before
    # the longest stem: learning_compare.py's, not learning.py's
    (results / "learning_compare_diff.json").write_text(LEGACY)
    assert common.results_writer("learning_compare_diff") == "learning_compare.py"
    monkeypatch.setattr(sys, "argv", [str(BENCH / "learning.py")])
    with pytest.raises(argparse.ArgumentTypeError, match="hold the results of learning_compare.py, not of learning.py"):
        common.results_name("learning_compare_diff")
    monkeypatch.setattr(sys, "argv", [str(BENCH / "weight_sync.py"), "--name", "weight_sync_old"])
    assert common.plots_name()("weight_sync_old") == "weight_sync_old"
    common.write_results("weight_sync_old", [{"b": 2}])
    assert json.loads((results / "weight_sync_old.json").read_text())["rows"] == [{"b": 2}]


def test_results_older_than_the_provenance_named_after_no_script_are_refused(common, results, capsys):
    import argparse

    (results / "sweep_by_hand.json").write_text(LEGACY)
    assert common.results_writer("sweep_by_hand") == ""
    with pytest.raises(argparse.ArgumentTypeError, match="hold files no benchmark wrote"):
        common.results_name("sweep_by_hand")
    with pytest.raises(SystemExit):
        common.write_results("sweep_by_hand", [{"b": 2}])
    assert (results / "sweep_by_hand.json").read_text() == LEGACY


def test_every_result_older_than_the_provenance_is_named_after_an_existing_script(common):
    """The results in benchmarks/results without a command (read, never written, here) each map to their script."""
    legacy = {}
    for path in sorted((BENCH / "results").glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "rows" in data and "command" not in data:
            legacy[path.stem] = common.legacy_writer(path.stem)
    assert legacy, "no legacy results found: is this the repository's benchmarks/results?"
    orphans = sorted(name for name, writer in legacy.items() if not writer or not (BENCH / writer).is_file())
    assert not orphans
    assert legacy.get("learning_compare_diff", "learning_compare.py") == "learning_compare.py"
    assert legacy.get("scale_sim_t20_memory", "scale_sim.py") == "scale_sim.py"


def test_a_name_whose_derived_results_another_script_wrote_is_refused(common, results):
    import argparse

    check = common.results_names("", "_hrr")  # this process: cpu_engines.py; results/gate.json is learning_gate.py's
    assert check("mine") == "mine"
    with pytest.raises(argparse.ArgumentTypeError, match=r"'gate': .*hold the results of learning_gate.py"):
        common.results_names("_x", "")("gate")
    (results / "gate.json").rename(results / "mine_hrr.json")
    with pytest.raises(argparse.ArgumentTypeError, match=r"'mine_hrr': .*hold the results of learning_gate.py"):
        check("mine")


def test_the_learning_gate_checks_its_hrr_results_name_when_the_arguments_are_parsed(common, results, monkeypatch,
                                                                                     capsys):
    """learning_gate.py writes <name> and <name>_hrr: a --name whose _hrr results another script wrote is refused
    before any run, not after the gate's results were written."""
    from ziprl.testing.outputs import digests

    sys.path.insert(0, str(BENCH))
    try:
        learning_gate = importlib.import_module("learning_gate")
    finally:
        sys.path.remove(str(BENCH))
    common.write_results("mine_hrr", [{"a": 1}])  # this process: cpu_engines.py
    before = digests(results)
    # nothing to run either: without the check, argparse would pass and the run would exit on that instead
    monkeypatch.setattr(sys, "argv", [str(BENCH / "learning_gate.py"), "--name", "mine", "--seeds", "",
                                      "--mutations", "none", "--hrr-seeds", "", "--drift-seeds", ""])
    with pytest.raises(SystemExit) as exc:
        learning_gate.main()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --name: 'mine_hrr':" in err
    assert "hold the results of cpu_engines.py, not of learning_gate.py; nothing was written" in err
    assert digests(results) == before


@pytest.mark.parametrize(("name", "text"), [("notes.md", "# measured by hand\n"), ("sweep.json", '{"results": {}}'),
                                            ("torn.json", '{"rows": [')])
def test_files_write_results_did_not_write_are_refused(common, results, name, text):
    import argparse

    (results / name).write_text(text)
    with pytest.raises(argparse.ArgumentTypeError, match="hold files no benchmark wrote"):
        common.results_name(Path(name).stem)
    assert (results / name).read_text() == text


def test_an_argument_that_is_not_utf8_exits_2_before_any_benchmark_work(tmp_path):
    """Bytes that are not UTF-8 (a path no result, marker or Parquet file could record) are refused when _common is
    imported, which every benchmark does first: nothing is written."""
    proc = subprocess.run([sys.executable.encode(), str(BENCH / "checkpoint_write.py").encode(), b"--dir",
                           str(tmp_path).encode() + b"/\xff"], capture_output=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.decode().strip().endswith("is not UTF-8 text; nothing was done: give paths and text in UTF-8")
    assert list(tmp_path.iterdir()) == []


def test_command_lines_with_bytes_that_are_not_utf8_are_recorded_escaped(common, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["benchmarks/decode_ops.py", "--name", "a\udcffb"])
    assert common.command_line() == "python benchmarks/decode_ops.py --name 'a\\xffb'"
    monkeypatch.setattr(sys, "argv", ["scripts/gpu_learn.sh", "--minutes", "9"])
    assert common.command_line() == "bash scripts/gpu_learn.sh --minutes 9"


def test_number_and_list_argument_types_exit_2_at_parse_time(common, capsys):
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=common.at_least(1))
    ap.add_argument("--x", type=common.at_least(0.0, float))
    ap.add_argument("--ns", type=common.listed(common.at_least(0)))
    assert vars(ap.parse_args(["--n", "3", "--x", "0.5", "--ns", "0, 2,"])) == {"n": 3, "x": 0.5, "ns": [0, 2]}
    for argv, message in ((["--n", "0"], "'0': must be at least 1"), (["--n", "x"], "'x' is not an integer"),
                          (["--x", "nan"], "'nan': must be at least 0.0"), (["--x", "inf"], "'inf': give a finite number"),
                          (["--ns", "1,a"], "'a' is not an integer"),
                          (["--ns", ","], "give at least one comma-separated value")):
        with pytest.raises(SystemExit) as exc:
            ap.parse_args(argv)
        assert exc.value.code == 2
        assert message in capsys.readouterr().err


def test_plots_another_script_wrote_or_none_did_are_refused(common, results, monkeypatch):
    """A plot records the script that wrote it; a name whose plot another script (or no benchmark) wrote is refused
    when the arguments are parsed, the file kept. An untagged plot beside results this script wrote is its own."""
    import argparse

    from ziprl.plots import _plt, save_figure

    save_figure(_plt().figure(), results / "mine.png")  # this process: cpu_engines.py
    assert common.png_writer(results / "mine.png") == "cpu_engines.py"
    assert common.plots_name()("mine") == "mine"
    monkeypatch.setattr(sys, "argv", [str(BENCH / "weight_sync.py")])
    with pytest.raises(argparse.ArgumentTypeError, match=r"mine\.png is a plot of cpu_engines\.py; nothing was"):
        common.plots_name()("mine")
    (results / "user.png").write_bytes(b"my own png")
    with pytest.raises(argparse.ArgumentTypeError, match=r"user\.png is not a plot this script wrote"):
        common.plots_name()("user")
    assert (results / "user.png").read_bytes() == b"my own png"
    (results / "gate_reward.png").write_bytes(b"written before plots were tagged")
    with pytest.raises(argparse.ArgumentTypeError, match="gate_reward.png is not a plot this script wrote"):
        common.check_plots("gate", ("_reward",))
    monkeypatch.setattr(sys, "argv", [str(BENCH / "learning_gate.py")])  # which wrote results/gate.json
    assert common.check_plots("gate", ("_reward",)) == "gate"


def test_write_results_removes_the_temporaries_a_killed_write_of_its_name_left(common, results, monkeypatch):
    """A write killed between its two atomic writes leaves ``.<name>.json.<hex>.tmp``; the next write of that name
    removes it (and the .md's), but not another name's, a link, or a directory."""
    own = [results / ".gate.json.0123abcd.tmp", results / ".gate.md.deadbeef.tmp"]
    for path in own:
        path.write_text("torn")
    kept = [results / ".gate_hrr.json.0123abcd.tmp", results / ".gate.json.x.tmp", results / ".gate.jsonl.0123abcd.tmp"]
    for path in kept:
        path.write_text("another's")
    (results / ".gate.json.feedbeef.tmp").symlink_to(results / "gate.md")
    (results / ".gate.md.abcd_123.tmp").mkdir()
    kept += [results / ".gate.json.feedbeef.tmp", results / ".gate.md.abcd_123.tmp"]
    common.write_results("other", [{"a": 1}])
    assert all(p.exists() for p in own)  # only the name written
    monkeypatch.setattr(sys, "argv", [str(BENCH / "learning_gate.py")])  # which wrote results/gate.json
    common.write_results("gate", [{"a": 2}])
    assert not any(os.path.lexists(p) for p in own)
    assert all(os.path.lexists(p) for p in kept)
    assert (results / "gate.md").is_file()


def test_checkpoint_write_writes_its_file_under_the_system_temporary_directory(common, tmp_path, monkeypatch):
    """Not beside the results: a killed run would leave a checkpoint-sized file in the repository for good."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "system-tmp"))
    (tmp_path / "system-tmp").mkdir()
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(sys, "argv", [str(BENCH / "checkpoint_write.py")])
    sys.path.insert(0, str(BENCH))
    try:
        checkpoint_write = importlib.import_module("checkpoint_write")
    finally:
        sys.path.remove(str(BENCH))
    args, tmp = checkpoint_write.arguments(["--gb", "0.001", "--name", "ckpt"])
    try:
        assert Path(tmp.name).parent == tmp_path / "system-tmp"
    finally:
        tmp.cleanup()
