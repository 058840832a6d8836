"""Registries: plug-in discovery by file, ordering, clear errors, and a tool, a reward and a generation engine added
by registration alone."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import types

import pytest

from ziprl.config import ConfigError, EnvConfig, SamplingConfig, load_config, main
from ziprl.env import SearchCompressEnv
from ziprl.env.protocol import parse_turn
from ziprl.env.stats import trajectory_stats
from ziprl.env.tools import closing_tags
from ziprl.env.trajectory import Trajectory, Turn
from ziprl.learner.trainer import rollout_matches_learner
from ziprl.policy import make_engine
from ziprl.policy.engine import EngineSpec, GenerationEngine, stop_strings
from ziprl.registry import ENGINES, REWARDS, STRATEGIES, TOOLS, TRANSPORTS, Registry
from ziprl.retrieval.types import QAExample
from ziprl.testing.echo_tool import Echo
from ziprl.testing.word_retriever import PASSAGES, WordRetriever
from ziprl.weights import LearnerWeights


def test_builtin_entries_in_order():
    assert STRATEGIES.names()[:4] == ("adaptive", "uniform", "react", "summary")
    assert TOOLS.names() == ("search", "open", "answer")
    assert REWARDS.names() == ("em", "f1")
    assert ENGINES.names() == ("hf", "vllm", "llamacpp")
    assert TRANSPORTS.names() == ("object_store", "collective")
    assert closing_tags() == ["</search>", "</open>", "</answer>"]
    assert stop_strings(SamplingConfig()) == closing_tags()
    assert stop_strings(SamplingConfig(stop=["x", ""])) == ["x"]


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

        assert list(REG) == ["bee", "ay"]
        assert len(REG) == 2
        assert REG["ay"]() == 1
        assert "bee" in REG
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
    assert err.startswith(f"error: {needle}")
    assert err.endswith("'magic'\n")
    assert err.count("\n") == 1


def test_registration_modules_import_neither_torch_nor_vllm_nor_llama_cpp():
    """The config looks engine (and weight transport) names up, so ``ziprl.policy.engines`` (and ``ziprl.weights``)
    must stay cheap to import, as must the engine class's module."""
    import subprocess

    code = ("import sys\nfrom ziprl.config import load_config\nload_config(None, ['model.engine=vllm'])\n"
            "from ziprl.registry import ENGINES\nprint(ENGINES.names(), ENGINES['vllm'].engine_class().__name__, "
            "sorted(m for m in ('torch', 'vllm', 'llama_cpp') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out == "('hf', 'vllm', 'llamacpp') VLLMEngine []\n"


def test_registering_a_tool_is_all_it_takes(monkeypatch):
    """Parser, system prompt, stop strings, the env's dispatch and the statistics all follow the registry."""
    TOOLS.names()
    monkeypatch.setitem(TOOLS._entries, "echo", (5, Echo))
    monkeypatch.setitem(REWARDS._entries, "half", (5, lambda prediction, golds: 0.5))
    assert parse_turn("<echo>abc</echo>").action == "echo"
    assert "</echo>" in closing_tags()
    assert "<echo>…</echo>" in parse_turn("no tags").error
    env = SearchCompressEnv(EnvConfig(strategy="react", reward="half"), retriever=WordRetriever(PASSAGES),
                            examples=[QAExample("q", "Capital of France?", ["Paris"])])
    env.reset(seed=0)
    assert "<echo>text</echo> returns the text reversed" in env.system
    obs, *_, info = env.step("<echo>siraP</echo>")
    assert info["action"] == "echo"
    assert info["tool_error"] is None
    assert "Paris" in obs
    *_, info = env.step("<echo>Parïs</echo>")
    assert info["tool_error"] == "the echo tool rejected the request: ASCII only"
    _, reward, term, *_ = env.step("<answer>Lyon</answer>")
    assert term
    assert reward == 0.5
    trajs = [Trajectory("q", "q", ["x"], turns=[Turn(action="echo"), Turn(action="echo"), Turn(action="answer")])]
    assert trajectory_stats(trajs)["echoes"] == 2.0


class Recorder(GenerationEngine):
    """An engine that receives collective pushes itself (as vLLM does) and records what it is asked."""

    tokenizer = None

    def __init__(self, path, dtype):
        self.path, self.dtype, self.calls = path, dtype, []

    def generate(self, prompts, sampling, seed=None):
        return []

    def load_weights(self, named_arrays, version):
        self.calls.append(("load", version))

    def join_weights(self, addr, port, rank, world, timeout_s, bind):
        self.calls.append(("join", addr, port, rank, world))

    def receive_weights(self, metas, version):
        self.calls.append(("receive", metas, version))
        self.version = version
        return version

    @classmethod
    def sender_end(cls, addr, port, world, timeout_s, bind, device):
        return SentRecorder(("open", addr, port, world))


class SentRecorder:
    """The learner's end of :class:`Recorder`'s own group: records what it is asked to send."""

    def __init__(self, opened):
        self.calls = [opened]

    def send(self, version, count, buckets):
        self.calls.append(("send", version, count, [[m.name for m in metas] for metas, _ in buckets]))


class GroupRecorder(GenerationEngine):
    """An engine with the receiver's defaults (ZipRL's own group), as HFEngine has."""

    tokenizer = None

    def __init__(self, path, dtype):
        self.calls = []

    def generate(self, prompts, sampling, seed=None):
        return []

    def load_weights(self, named_arrays, version):
        self.calls.append(("load", version))


def learner_weights(receiver):
    """A learner rank 0 whose only parameter is one float32 vector, for ``receiver`` engines in bf16."""
    import torch

    return LearnerWeights([("w", torch.arange(4, dtype=torch.float32))], lambda ps: contextlib.nullcontext(), "cpu",
                          0, False, "bfloat16", receiver)


def register(monkeypatch, cls, cpu=False):
    ENGINES.names()
    spec = EngineSpec(lambda: cls, lambda c, m, path: c(path, m.dtype), cpu=cpu,
                      exact_logprobs=lambda m: m.dtype == "bfloat16")
    monkeypatch.setitem(ENGINES._entries, "recorder", (5, spec))


def test_registering_an_engine_is_all_it_takes(tmp_path, monkeypatch):
    """The config accepts it (with its CPU rule), make_engine builds it, the trainer and both ends of a
    collective weight push follow the engine class."""
    register(monkeypatch, Recorder)
    with pytest.raises(ConfigError, match=re.escape("model.engine=recorder runs on CUDA only: set model.device="
                                                    "auto (or cuda), or model.engine=hf | llamacpp for the CPU")):
        load_config(None, ["model.engine=recorder", "model.device=cpu"])
    cfg = load_config(None, ["model.engine=recorder", "model.dtype=bfloat16", "model.num_threads=0"])
    engine = make_engine(cfg.model, tmp_path)
    assert type(engine) is Recorder
    assert engine.path == tmp_path
    assert engine.dtype == "bfloat16"
    assert rollout_matches_learner(cfg, bf16=False)
    assert not rollout_matches_learner(cfg, bf16=True)

    transport = TRANSPORTS["collective"](1.0)
    weights = learner_weights(ENGINES["recorder"].engine_class())
    end = transport.join(weights, "127.0.0.1", 29500, 2, 5.0, "127.0.0.1")  # the engine class's own sender end
    engine.join_weights("127.0.0.1", 29500, 1, 2, 5.0, "127.0.0.1")
    plan = transport.announce(weights, 7, None)
    assert transport.receive(engine, plan, None) == 7
    transport.send(weights, 7, end)
    assert engine.calls == [("join", "127.0.0.1", 29500, 1, 2), ("receive", [("w", "bfloat16", [4])], 7)]
    assert end.calls == [("open", "127.0.0.1", 29500, 2), ("send", 7, 1, [["w"]])]


def test_the_learner_end_of_vllm_broadcasts_tensor_by_tensor(monkeypatch):
    """VLLMEngine's sender end opens vLLM's communicator and sends each tensor unpacked, in the announced order."""
    from ziprl.policy import VLLMEngine

    opened = []
    comm = types.SimpleNamespace(broadcast=lambda t, src, stream: opened.append(("broadcast", t.tolist())))
    nccl = types.SimpleNamespace(trainer_init=lambda info: opened.append(("init", info)) or comm)
    monkeypatch.setitem(sys.modules, "vllm.distributed.weight_transfer.nccl_common", nccl)
    monkeypatch.setattr("torch.cuda.current_stream", lambda: None)
    transport, weights = TRANSPORTS["collective"](1.0), learner_weights(VLLMEngine)
    end = transport.join(weights, "127.0.0.1", 29500, 2, 5.0, "127.0.0.1")
    transport.send(weights, 7, end)
    assert opened == [("init", {"master_address": "127.0.0.1", "master_port": 29500, "world_size": 2}),
                      ("broadcast", [0.0, 1.0, 2.0, 3.0])]
    assert transport.join(dataclasses.replace(weights, rank=1), "127.0.0.1", 29500, 2, 5.0, "127.0.0.1") is None


def test_an_engine_on_the_ziprl_group_needs_the_group(tmp_path, monkeypatch):
    register(monkeypatch, GroupRecorder, cpu=True)
    cfg = load_config(None, ["model.engine=recorder", "model.device=cpu"])
    engine = make_engine(cfg.model, tmp_path)
    plan = TRANSPORTS["collective"](1.0).announce(learner_weights(GroupRecorder), 7, None)
    with pytest.raises(RuntimeError, match="no member of the weight group"):
        TRANSPORTS["collective"](1.0).receive(engine, plan, None)
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
