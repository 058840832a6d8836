"""Config files and ``--set`` values are plain data only, bounded in size, and every bad one is a ConfigError
naming the file or key and the fix (issue 23, item 2)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO
from ziprl.config import ConfigError, load_config, main, yaml_value

TAGS = [
    "!!python/object/apply:os.getcwd []",
    "!!python/object/apply:os.mkdir [{sentinel}]",
    "!!python/name:os.system",
    "!!python/tuple [1, 2]",
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!omap [a: 1]",
    "!!timestamp 2020-01-01",
    "!custom 3",
]


def billion_laughs(levels: int, width: int = 9) -> str:
    """A config whose ``demos.datasets`` list nests ``levels`` anchors, each ``width`` aliases of the one before."""
    items = ["&a0 [" + ",".join(["lol"] * width) + "]"]
    items += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "demos:\n  datasets: [" + ", ".join(items) + "]\n"


@pytest.mark.parametrize("tag", TAGS)
def test_set_values_and_files_are_plain_data_only(tag, tmp_path):
    sentinel = tmp_path / "made"
    value = tag.replace("{sentinel}", str(sentinel))
    with pytest.raises(ConfigError, match=r"env.max_turns: line 1: YAML tag !.* is not allowed; .*plain data"):
        load_config(None, [f"env.max_turns={value}"])
    path = tmp_path / "tagged.yaml"
    path.write_text(f"env:\n  max_turns: {value}\n")
    with pytest.raises(ConfigError, match=rf"config file {path}: line 2: YAML tag !.* is not allowed"):
        load_config(path)
    assert not sentinel.exists()


def test_plain_values_still_load():
    assert yaml_value("[1, 2.5, true, null, {a: b}]", "x") == [1, 2.5, True, None, {"a": "b"}]
    assert yaml_value("2020-01-01", "x") == "2020-01-01"  # an implicit date stays the text written
    cfg = load_config(None, ["demos.datasets=[hotpotqa, musique]", "data.dataset=2020-01-01", "env.max_turns=0x10"])
    assert cfg.demos.datasets == ["hotpotqa", "musique"]
    assert cfg.data.dataset == "2020-01-01"
    assert cfg.env.max_turns == 16


def test_off_on_yes_and_no_are_words_that_a_boolean_field_reads_as_booleans(tmp_path):
    """YAML 1.2's booleans (true, false): a word field keeps off (rollout.overlap=off, not 'False')."""
    assert yaml_value("[off, On, yes, NO, true, FALSE]", "x") == ["off", "On", "yes", "NO", True, False]
    cfg = load_config(None, ["rollout.overlap=off", "learner.rollout_correction=off", "run.resume=on",
                             "rollout.dynamic_sampling=yes", "learner.bf16=no"])
    assert (cfg.rollout.overlap, cfg.learner.rollout_correction) == ("off", "off")
    assert (cfg.run.resume, cfg.rollout.dynamic_sampling, cfg.learner.bf16) == (True, True, False)
    path = tmp_path / "words.yaml"
    path.write_text("rollout:\n  overlap: off\nrun:\n  resume: off\n")
    cfg = load_config(path)
    assert (cfg.rollout.overlap, cfg.run.resume) == ("off", False)


@pytest.mark.parametrize("raw, needle", [
    ("[1", "env.max_turns: not valid YAML"),
    ("{a: 1", "env.max_turns: not valid YAML"),
    ("'unterminated", "env.max_turns: not valid YAML"),
    ("a: b: c", "env.max_turns: not valid YAML"),
    ("\x00", r"env.max_turns: holds a NUL byte \(\\0\) at position 0; remove it"),
    ("&x 3", "anchors and aliases"),
    ("*x", "anchors and aliases"),
    ("[" * 200 + "]" * 200, "nested more than"),
])
def test_bad_set_values_name_the_key(raw, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(None, [f"env.max_turns={raw}"])


def test_a_tiny_alias_bomb_is_refused_at_once(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(billion_laughs(2, 2))
    with pytest.raises(ConfigError, match=r"line 2: YAML anchors and aliases .* are not allowed; write the values out"):
        load_config(path)


def test_billion_laughs_is_refused_within_bounded_memory(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(billion_laughs(9))
    assert len(path.read_bytes()) < 500
    cap = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from ziprl.config import main
        sys.exit(main(["--show", "--config", {str(path)!r}]))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", cap], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2, proc.stderr[-500:]
    assert proc.stderr.startswith("error: config file")
    assert "anchors and aliases" in proc.stderr


def test_config_file_problems_name_the_file_and_the_fix(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=rf"config file {tmp_path} is a directory; pass a YAML file"):
        load_config(tmp_path)
    garbage = tmp_path / "garbage.yaml"
    garbage.write_bytes(b"env:\n  strategy: \x01\x02\x03\n")
    with pytest.raises(ConfigError, match="config file .*garbage.yaml: not valid YAML"):
        load_config(garbage)
    for text, kind in (("- env\n- data\n", "a list"), ("hello\n", "a str"), ("3\n", "an int")):
        top = tmp_path / "top.yaml"
        top.write_text(text)
        with pytest.raises(ConfigError, match=rf"top.yaml holds {kind}, not a mapping of sections; write it as "
                                              r"'section:' lines, e.g. 'env:' then 'max_turns: 6' indented under it"):
            load_config(top)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert load_config(empty).env.max_turns == 6
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (2 << 20))
    with pytest.raises(ConfigError, match="is 2097152 bytes; a config file is at most 1048576"):
        load_config(big)

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(ConfigError, match=r"config file .*top.yaml cannot be read \(Permission denied\); check "):
        load_config(tmp_path / "top.yaml")


@pytest.mark.parametrize("text, needle", [
    ("envv:\n  top_k: 3\n", r"unknown config key\(s\) \['envv'\] in top level; did you mean 'env'\?"),
    ("env:\n  max_turn: 3\n", r"unknown config key\(s\) \['max_turn'\] in env; did you mean 'max_turns'\?"),
    ("1: a\n~: b\n", r"unknown config key\(s\) \['1', 'None'\] in top level"),
    ("env: 5\n", "env: expected a mapping of env's fields, got int"),
    ("env:\n  scoring: [1]\n", "env.scoring: expected a mapping of scoring's fields, got list"),
])
def test_unknown_keys_and_bad_sections(text, needle, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_config(path)


def test_a_null_section_keeps_its_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("env:\nlearner:\n  lr: 0.01\n")
    assert load_config(path).env.max_turns == 6


@pytest.mark.parametrize("override, needle", [
    ("model.path=[1]", "model.path: expected str, got a list"),
    ("model.path={a: 1}", "model.path: expected str, got a mapping"),
    ("env.max_turns=true", "env.max_turns: expected int, got True"),
    ("learner.lr=[1]", "learner.lr: expected float, got a list"),
    ("env.max_turns=1.0e+400", "env.max_turns: expected int, got inf"),
    ("demos.datasets={a: 1}", "demos.datasets: expected a list, got a mapping"),
    ("demos.datasets=[[a]]", r"demos.datasets: expected str, got a list"),
    ("env.max_turns", "override 'env.max_turns' must look like section.field=value"),
    ("=3", "override '=3': name a field"),
    ("env.max_turnz=3", r"did you mean 'max_turns'\?"),
    ("envv.max_turns=3", r"no config section 'envv'; did you mean 'env'\?"),
    ("env.scoring=3", "env.scoring: expected a mapping"),
])
def test_override_types_are_strict(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(None, [override])


def test_show_prints_one_error_line(capsys):
    assert main(["--show", "--set", "env.max_turns=[1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: env.max_turns: not valid YAML")
    assert err.count("\n") == 1


SECTIONS = ("sections: ['env', 'retriever', 'model', 'sampling', 'data', 'rollout', 'learner', 'sft', 'demos', 'ray', "
            "'weights', 'run']")


@pytest.mark.parametrize("key, message", [
    ("__class__.__class__.x", f"no config section '__class__'; {SECTIONS}"),
    ("__class__.env", f"no config section '__class__'; {SECTIONS}"),
    ("env.__class__.x", "no config section '__class__'; sections: ['scoring']"),
    ("env.__dict__.x", "no config section '__dict__'; sections: ['scoring']"),
    ("env.max_turns.x", "no config section 'max_turns'; sections: ['scoring']"),
])
def test_a_set_path_walks_config_sections_only(key, message, capsys):
    """Attributes that are no config field (__class__, __dict__) are unknown sections, like any other typo."""
    assert main(["--show", "--set", f"{key}=1"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: override '{key}': {message}\n"
    assert load_config(None, ["env.scoring.w_sem=0.25"]).env.scoring.w_sem == 0.25


@pytest.mark.parametrize("text, needle", [
    ("env:\n  max_turns: 3\n  max_turns: 4\n", r"line 3: key 'max_turns' is given twice \(first on line 2\); keep one"),
    ("env:\n  top_k: 3\nenv:\n  max_turns: 4\n", r"line 3: key 'env' is given twice \(first on line 1\); keep one"),
    ("demos:\n  datasets: [{a: 1, a: 2}]\n", r"line 2: key 'a' is given twice"),
])
def test_duplicate_keys_are_refused(text, needle, tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"^config file {path}: {needle}"):
        load_config(path)


def test_duplicate_keys_in_a_set_mapping_are_refused():
    with pytest.raises(ConfigError, match=r"^env.scoring: line 1: key 'w_info' is given twice"):
        load_config(None, ["env.scoring={w_info: 0.5, w_info: 0.1}"])
    assert load_config(None, ["env.scoring={w_info: 0.5, w_sem: 0.1}"]).env.scoring.w_sem == 0.1


@pytest.mark.parametrize("override, message", [
    ("run.out_dir=null", "run.out_dir: expected a path, got null"),
    ("demos.out=~", "demos.out: expected a path, got null"),
    ("model.cache_dir=null", "model.cache_dir: expected a path, got null"),
    ("run.out_dir=None", "run.out_dir is 'None', which reads as null, but run.out_dir must be a path; write ./None for "
                         "a folder of that name"),
    ("run.out_dir=", "run.out_dir is empty; give a path"),
    ("model.path=''", "model.path is empty; give a path or null (the default)"),
    ("demos.datasets=[sample, null]", "demos.datasets: expected a path, got null"),
    ("retriever.query_prefix=null", "retriever.query_prefix: expected str, got null"),
    ("env.strategy=null", "env.strategy: expected str, got null"),
])
def test_null_is_no_path(override, message):
    with pytest.raises(ConfigError) as exc:
        load_config(None, [override])
    assert str(exc.value) == message


def test_null_path_in_a_file_names_the_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  out_dir:\n")
    with pytest.raises(ConfigError, match=r"^run.out_dir: expected a path, got null$"):
        load_config(path)
    assert load_config(None, ["run.out_dir=./None"]).run.out_dir == "./None"
    assert load_config(None, ["model.path=null"]).model.path is None  # a nullable path keeps its default


@pytest.mark.parametrize("field", ["run.out_dir", "model.path", "retriever.corpus", "data.dataset", "demos.out"])
def test_a_nul_byte_in_a_path_is_refused_at_load(field, tmp_path):
    section, name = field.split(".")
    path = tmp_path / "nul.yaml"
    path.write_text(f'{section}:\n  {name}: "runs/a\\0b"\n')
    with pytest.raises(ConfigError, match=rf"^{field} 'runs/a\\x00b' holds a NUL byte \(\\0\) at position 6; remove it"):
        load_config(path)
    path.write_text('demos:\n  datasets: [sample, "x\\0"]\n')
    with pytest.raises(ConfigError, match=r"^demos.datasets 'x\\x00' holds a NUL byte"):
        load_config(path)


@pytest.mark.parametrize("override, needle", [
    ("env.strategy={big}", "got 'aaaa"), ("ray.address='a {big}'", "(1000002 chars)"),
    ("run.out_dir=\"{big}\\0\"", "(1000001 chars) holds a NUL byte (\\0) at position 1000000"),
    ("env.max_turns={digits}", "a number of more than 4300 digits"), ("model.path=[{big}]", "got a list"),
    ("env.scoring={{{big}: 1}}", "not valid YAML"), ("{big}", "(1000000 chars) must look like section.field=value"),
])
def test_a_long_value_is_shortened_in_the_message(override, needle, capsys):
    big, digits = "a" * 1_000_000, "1" * 1_000_000
    assert main(["--show", "--set", override.format(big=big, digits=digits)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert len(err) < 300, err[:400]
    assert needle in err


@pytest.mark.parametrize("override", ["{big}.x=1", "env.{big}=1"])
def test_a_long_key_is_shortened_in_the_message(override, capsys):
    assert main(["--show", "--set", override.format(big="a" * 1_000_000)]) == 2
    err = capsys.readouterr().err
    assert len(err) < 600, err[:700]  # the key twice, shortened, and the names it could be
    assert "... (1000000 chars)" in err


def _show(*args: str, stdout=None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "ziprl.config", "--show", *args], stdout=stdout or subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout, env=env)


def test_a_fifo_config_is_refused_before_it_is_opened(tmp_path):
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)  # opening it to read would wait for a writer forever
    proc = _show("--config", str(fifo))
    assert proc.returncode == 2
    assert proc.stderr == (f"error: config file {fifo} is not a regular file; pass the path of a YAML file, e.g. "
                           "configs/laptop.yaml\n")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_standard_output_on_a_full_disk_is_a_user_error():
    with open("/dev/full", "w") as full:
        proc = _show(stdout=full)
    assert proc.returncode == 2
    assert proc.stderr == ("error: standard output: No space left on device; free some disk space or choose a location "
                           "on another disk\n")
