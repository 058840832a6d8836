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
    assert cfg.demos.datasets == ["hotpotqa", "musique"] and cfg.data.dataset == "2020-01-01"
    assert cfg.env.max_turns == 16


@pytest.mark.parametrize("raw, needle", [
    ("[1", "env.max_turns: not valid YAML"),
    ("{a: 1", "env.max_turns: not valid YAML"),
    ("'unterminated", "env.max_turns: not valid YAML"),
    ("a: b: c", "env.max_turns: not valid YAML"),
    ("\x00", "env.max_turns: not valid YAML"),
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
    assert proc.stderr.startswith("error: config file") and "anchors and aliases" in proc.stderr


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
                                              r"'section:' lines, e.g. 'env:' then '  max_turns: 6'"):
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
    assert err.startswith("error: env.max_turns: not valid YAML") and err.count("\n") == 1
