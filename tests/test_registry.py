"""Registries: plug-in discovery by file, ordering, clear errors, and a tool and a reward added by registration alone."""

from __future__ import annotations

import re
import sys

import pytest

from tests.conftest import PASSAGES, WordRetriever
from ziprl.config import ConfigError, EnvConfig, SamplingConfig, load_config
from ziprl.env import SearchCompressEnv
from ziprl.env.protocol import parse_turn
from ziprl.env.stats import trajectory_stats
from ziprl.env.tools import Tool, ToolResult, closing_tags
from ziprl.env.trajectory import Trajectory, Turn
from ziprl.env.types import QAExample
from ziprl.policy.engine import stop_strings
from ziprl.registry import REWARDS, STRATEGIES, TOOLS, Registry


def test_builtin_entries_in_order():
    assert STRATEGIES.names()[:4] == ("adaptive", "uniform", "react", "summary")
    assert TOOLS.names() == ("search", "open", "answer") and REWARDS.names() == ("em", "f1")
    assert closing_tags() == ["</search>", "</open>", "</answer>"]
    assert stop_strings(SamplingConfig()) == closing_tags() and stop_strings(SamplingConfig(stop=["x", ""])) == ["x"]


def test_a_new_file_in_the_package_registers_itself(tmp_path, monkeypatch):
    pkg = tmp_path / "plugs_for_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from ziprl.registry import Registry\nREG = Registry('plug', 'plugs_for_test')\n")
    (pkg / "b.py").write_text("from plugs_for_test import REG\n\n@REG.register('bee')\ndef bee():\n    return 2\n")
    (pkg / "a.py").write_text("from plugs_for_test import REG\n\n@REG.register('ay', order=200)\ndef ay():\n    return 1\n")
    (pkg / "_private.py").write_text("raise RuntimeError('helpers starting with _ are not plug-ins')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        from plugs_for_test import REG

        assert list(REG) == ["bee", "ay"] and len(REG) == 2 and REG["ay"]() == 1 and "bee" in REG
        assert "cee" not in REG
        with pytest.raises(KeyError, match="unknown plug 'cee'; registered: bee, ay"):
            REG["cee"]
        with pytest.raises(ValueError, match="registered twice"):
            REG.register("bee")(lambda: 3)
    finally:
        for name in [m for m in sys.modules if m.startswith("plugs_for_test")]:
            del sys.modules[name]


def test_a_broken_plug_in_fails_every_lookup(tmp_path, monkeypatch):
    pkg = tmp_path / "broken_plugs_for_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text("raise ImportError('needs the foo package')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("plug", "broken_plugs_for_test")
    try:
        for _ in range(2):
            with pytest.raises(ImportError, match="needs the foo package"):
                reg.names()
    finally:
        for name in [m for m in sys.modules if m.startswith("broken_plugs_for_test")]:
            del sys.modules[name]


def test_names_must_be_identifiers():
    with pytest.raises(ValueError, match="lower-case identifier"):
        Registry("thing", "nowhere").register("Bad-Name")


@pytest.mark.parametrize("override, needle", [
    ("env.strategy=magic", "env.strategy must be a registered strategy (adaptive, uniform, react, summary"),
    ("env.reward=magic", "env.reward must be a registered reward (em, f1), got 'magic'"),
])
def test_config_error_lists_registered_names(override, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(None, [override])


class Echo(Tool):
    """A tool that returns its argument reversed: what a newcomer's plug-in file would hold."""

    stats_key = "echoes"

    def describe(self, cfg: EnvConfig) -> str:
        return "<echo>text</echo> returns the text reversed"

    def run(self, env, argument: str, written: str) -> ToolResult:
        if not argument.isascii():
            raise ValueError("ASCII only")
        from ziprl.env.context import Observation

        return ToolResult(Observation(env.turn, f"echo {argument}", argument[::-1]))


def test_registering_a_tool_is_all_it_takes(monkeypatch):
    """Parser, system prompt, stop strings, the env's dispatch and the statistics all follow the registry."""
    TOOLS.names()
    monkeypatch.setitem(TOOLS._entries, "echo", (5, Echo))
    monkeypatch.setitem(REWARDS._entries, "half", (5, lambda prediction, golds: 0.5))
    assert parse_turn("<echo>abc</echo>").action == "echo" and "</echo>" in closing_tags()
    assert "<echo>…</echo>" in parse_turn("no tags").error
    env = SearchCompressEnv(EnvConfig(strategy="react", reward="half"), retriever=WordRetriever(PASSAGES),
                            examples=[QAExample("q", "Capital of France?", ["Paris"])])
    env.reset(seed=0)
    assert "<echo>text</echo> returns the text reversed" in env.system
    obs, *_, info = env.step("<echo>siraP</echo>")
    assert info["action"] == "echo" and info["tool_error"] is None and "Paris" in obs
    *_, info = env.step("<echo>Parïs</echo>")
    assert info["tool_error"] == "the echo tool rejected the request: ASCII only"
    _, reward, term, *_ = env.step("<answer>Lyon</answer>")
    assert term and reward == 0.5
    trajs = [Trajectory("q", "q", ["x"], turns=[Turn(action="echo"), Turn(action="echo"), Turn(action="answer")])]
    assert trajectory_stats(trajs)["echoes"] == 2.0
