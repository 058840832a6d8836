"""Registries: plug-in discovery by file, ordering, clear errors, and a tool, a reward and a generation engine added
by registration alone."""

from __future__ import annotations

import dataclasses
import re
import sys
import types

import pytest

from tests.conftest import PASSAGES, WordRetriever
from ziprl.actors.weight_sync import SendsWeights, WeightReceiver, WeightSource
from ziprl.config import ConfigError, EnvConfig, SamplingConfig, load_config, main
from ziprl.env import SearchCompressEnv
from ziprl.env.protocol import parse_turn
from ziprl.env.stats import trajectory_stats
from ziprl.env.tools import Tool, ToolResult, closing_tags
from ziprl.env.trajectory import Trajectory, Turn
from ziprl.learner.trainer import rollout_matches_learner
from ziprl.policy import make_engine
from ziprl.policy.engine import EngineSpec, GenerationEngine, stop_strings
from ziprl.registry import ENGINES, REWARDS, STRATEGIES, TOOLS, Registry
from ziprl.retrieval.types import QAExample


def test_builtin_entries_in_order():
    assert STRATEGIES.names()[:4] == ("adaptive", "uniform", "react", "summary")
    assert TOOLS.names() == ("search", "open", "answer") and REWARDS.names() == ("em", "f1")
    assert ENGINES.names() == ("hf", "vllm", "llamacpp")
    assert [ENGINES[n].weight_transfer for n in ENGINES] == ["ziprl_group", "vllm_nccl", "ziprl_group"]
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
    ("model.engine=magic", "model.engine must be a registered engine (hf, vllm, llamacpp), got 'magic'"),
])
def test_config_error_lists_registered_names(override, needle, capsys):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(None, [override])
    assert main(["--show", "--set", override]) == 2
    err = capsys.readouterr().err  # one line, exit code 2
    assert err.startswith(f"error: {needle}") and err.endswith("'magic'\n") and err.count("\n") == 1


def test_registration_modules_import_neither_torch_nor_vllm_nor_llama_cpp():
    """The config looks engine names up, so ``ziprl.policy.engines`` must stay cheap to import."""
    import subprocess

    code = ("import sys\nfrom ziprl.config import load_config\nload_config(None, ['model.engine=vllm'])\n"
            "from ziprl.registry import ENGINES\nprint(ENGINES.names(), ENGINES['vllm'].weight_transfer, "
            "sorted(m for m in ('torch', 'vllm', 'llama_cpp') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out == "('hf', 'vllm', 'llamacpp') vllm_nccl []\n"


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


class Recorder(GenerationEngine):
    """An engine that receives weight pushes itself (as vLLM does) and records what it is asked."""

    weight_transfer = "vllm_nccl"
    tokenizer = None

    def __init__(self, path, dtype):
        self.path, self.dtype, self.calls = path, dtype, []

    def generate(self, prompts, sampling, seed=None):
        return []

    def load_weights(self, named_arrays, version):
        self.calls.append(("load", version))

    def join_weight_transfer(self, addr, port, rank, world):
        self.calls.append(("join", addr, port, rank, world))

    def receive_weight_transfer(self, metas, version):
        self.calls.append(("receive", metas, version))
        self.version = version


class GroupRecorder(Recorder):
    weight_transfer = "ziprl_group"


class Sender(SendsWeights):
    """A learner rank 0 whose only parameter is one float32 vector."""

    def __init__(self, cfg):
        import torch

        self.cfg, self.tensor = cfg, torch.arange(4, dtype=torch.float32)

    def weight_source(self):
        import contextlib

        return WeightSource([("w", self.tensor)], lambda ps: contextlib.nullcontext(), "cpu", 0, False, 3)


def register(monkeypatch, cls, cpu=False):
    ENGINES.names()
    spec = EngineSpec(lambda: cls, lambda c, m, path: c(path, m.dtype), cpu=cpu,
                      exact_logprobs=lambda m: m.dtype == "bfloat16")
    monkeypatch.setitem(ENGINES._entries, "recorder", (5, spec))


def test_registering_an_engine_is_all_it_takes(tmp_path, monkeypatch):
    """The config accepts it (with its CPU rule), make_engine builds it, the trainer and both ends of a
    collective weight push follow its spec."""
    register(monkeypatch, Recorder)
    with pytest.raises(ConfigError, match=re.escape("model.engine=recorder runs on CUDA only: set model.device="
                                                    "auto (or cuda), or model.engine=hf | llamacpp for the CPU")):
        load_config(None, ["model.engine=recorder", "model.device=cpu"])
    cfg = load_config(None, ["model.engine=recorder", "model.dtype=bfloat16", "model.num_threads=0"])
    engine = make_engine(cfg.model, tmp_path)
    assert type(engine) is Recorder and engine.path == tmp_path and engine.dtype == "bfloat16"
    assert rollout_matches_learner(cfg, bf16=False) and not rollout_matches_learner(cfg, bf16=True)

    receiver = WeightReceiver(engine)  # the engine's own receiving end, no ZipRL group
    receiver.join("127.0.0.1", 29500, 1, 2, 5.0, "127.0.0.1")
    assert receiver.member is None and engine.calls == [("join", "127.0.0.1", 29500, 1, 2)]
    assert receiver.receive([("w", "bfloat16", [4])], 7) == 7
    assert engine.calls[-1] == ("receive", [("w", "bfloat16", [4])], 7)

    opened = []  # the learner opens vLLM's communicator and broadcasts tensor by tensor
    comm = types.SimpleNamespace(broadcast=lambda t, src, stream: opened.append(("broadcast", t.tolist())))
    nccl = types.SimpleNamespace(trainer_init=lambda info: opened.append(("init", info)) or comm)
    monkeypatch.setitem(sys.modules, "vllm.distributed.weight_transfer.nccl_common", nccl)
    monkeypatch.setattr("torch.cuda.current_stream", lambda: None)
    sender = Sender(cfg)
    sender.join_weight_group("127.0.0.1", 29500, 2, 5.0, "127.0.0.1")
    assert sender.broadcast_weights(7) == 64  # one bucket: 4 bf16 values padded to 64 bytes
    assert opened == [("init", {"master_address": "127.0.0.1", "master_port": 29500, "world_size": 2}),
                      ("broadcast", [0.0, 1.0, 2.0, 3.0])]


def test_an_engine_on_the_ziprl_group_needs_the_group(tmp_path, monkeypatch):
    register(monkeypatch, GroupRecorder, cpu=True)
    cfg = load_config(None, ["model.engine=recorder", "model.device=cpu"])
    engine = make_engine(cfg.model, tmp_path)
    assert ENGINES["recorder"].weight_transfer == "ziprl_group" and not Sender(cfg)._vllm_nccl()
    with pytest.raises(RuntimeError, match="no member of the group"):
        WeightReceiver(engine).receive([("w", "float32", [4])], 7)
    assert engine.calls == []


def test_an_engine_whose_package_is_missing_is_refused_with_the_config(monkeypatch):
    """An engine's ``requires`` is checked when the config is, before any stage runs, naming how to install it."""
    ENGINES.names()
    spec = EngineSpec(lambda: Recorder, lambda c, m, path: c(path, m.dtype), cpu=True, exact_logprobs=lambda m: False,
                      requires="no_such_package_for_ziprl", install="pip install no-such-package")
    monkeypatch.setitem(ENGINES._entries, "recorder", (5, spec))
    with pytest.raises(ConfigError, match=re.escape("model.engine=recorder needs a package that is not installed: "
                                                    "pip install no-such-package")):
        load_config(None, ["model.engine=recorder"])
    monkeypatch.setitem(ENGINES._entries, "recorder", (5, dataclasses.replace(spec, requires="json")))
    assert load_config(None, ["model.engine=recorder"]).model.engine == "recorder"
