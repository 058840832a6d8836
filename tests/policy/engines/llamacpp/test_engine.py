"""The llamacpp engine on the real default model: it computes HFEngine's model, refreshes weights in place, and
keeps HFEngine's generation contract (log-probs, stops, batches, bad input)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ziprl.config import ModelConfig, SamplingConfig
from ziprl.policy import HFEngine, make_engine
from ziprl.policy.engines.llamacpp.gguf import (
    MappedWeights,
    UnsupportedModel,
    rope_permute,
    tensor_name,
    write_gguf,
)
from ziprl.testing.engines import teacher_forced_logprobs
from ziprl.testing.learner import requires_deepspeed

llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is not installed (the opt-in llamacpp engine: bash scripts/setup.sh --llamacpp)")
from ziprl.policy.engines.llamacpp.engine import LlamaCppEngine  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

QUESTIONS = ["What is the capital of France?", "Write a long poem about the sea, the sky and the wind.", "Hi",
             "Name three primary colors."]


@pytest.fixture(scope="module")
def hf(default_model_dir) -> HFEngine:
    return HFEngine(default_model_dir, device="cpu")


@pytest.fixture(scope="module")
def engine(default_model_dir) -> LlamaCppEngine:
    e = LlamaCppEngine(default_model_dir, dtype="float32", threads=1)
    yield e
    e.close()


@pytest.fixture(scope="module")
def prompts(hf) -> list[list[int]]:
    return [hf.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]


def test_tensor_names_and_rope_layout():
    assert tensor_name("model.layers.7.self_attn.q_proj.weight", False) == "blk.7.attn_q.weight"
    assert tensor_name("model.layers.0.mlp.down_proj.weight", False) == "blk.0.ffn_down.weight"
    assert tensor_name("model.layers.3.post_attention_layernorm.weight", False) == "blk.3.ffn_norm.weight"
    assert tensor_name("lm_head.weight", True) == "token_embd.weight" == tensor_name("model.embed_tokens.weight", True)
    assert tensor_name("lm_head.weight", False) == "output.weight"
    with pytest.raises(KeyError, match="not a Llama parameter"):
        tensor_name("model.layers.0.self_attn.q_norm.weight", False)
    # one head of 4 rows [a0 a1 b0 b1] (rotate-half: pairs (a_i, b_i)) becomes llama.cpp's interleaved [a0 b0 a1 b1]
    w = torch.arange(8.0).reshape(4, 2)
    assert rope_permute(w, 1)[:, 0].tolist() == [0.0, 4.0, 2.0, 6.0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_an_in_place_write_leaves_the_file_a_fresh_export_of_the_new_weights(tiny_model_dir, tmp_path, dtype):
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)
    weights = load_file(str(tiny_model_dir / "model.safetensors"))
    write_gguf(tmp_path / "mapped.gguf", config, weights, dtype)
    mapped = MappedWeights(tmp_path / "mapped.gguf", config, dtype)
    g = torch.Generator().manual_seed(0)
    new = {n: torch.randn(v.shape, generator=g) for n, v in weights.items()}
    # as pushed: float32 numpy arrays (the object store), bf16 tensors (an in-process bf16 learner)
    mapped.write({n: v.numpy() if i % 2 else v.to(torch.bfloat16) for i, (n, v) in enumerate(new.items())})
    expected = {n: v if i % 2 else v.to(torch.bfloat16) for i, (n, v) in enumerate(new.items())}
    write_gguf(tmp_path / "fresh.gguf", config, expected, dtype)
    assert (tmp_path / "mapped.gguf").read_bytes() == (tmp_path / "fresh.gguf").read_bytes()


def test_float32_engine_computes_hf_float32s_model(engine, hf, prompts):
    sampling = SamplingConfig(greedy=True, max_new_tokens=24, stop=[])
    ours, theirs = engine.generate(prompts, sampling), hf.generate(prompts, sampling)
    assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
    for g, p in zip(ours, prompts, strict=True):
        assert g.prompt_ids == p
        assert len(g.logprobs) == len(g.token_ids) >= 1
        # its own kernels (summation order, RoPE angles built by repeated products): measured mean 2e-4-9e-4,
        # max 1e-3-5e-3 per token against HF float32; a wrong layout (RoPE permutation, a tensor) is off by > 0.1
        diff = np.abs(np.array(g.logprobs) - teacher_forced_logprobs(hf, p, g.token_ids).numpy())
        assert diff.mean() < 2e-3, diff
        assert diff.max() < 1e-2, diff


def test_batch_equals_one_prompt_at_a_time(engine, prompts):
    """The shared system prefix run once and copied, the unpadded batch and rows leaving it keep each row's own
    generation."""
    sampling = SamplingConfig(greedy=True, max_new_tokens=16, stop=[])
    batch = engine.generate(prompts, sampling)
    assert len({g.finish_reason for g in batch} | {len(g.token_ids) for g in batch}) > 1  # rows end at different steps
    for g, p in zip(batch, prompts, strict=True):
        alone = engine.generate([p], sampling)[0]
        assert alone.token_ids == g.token_ids
        assert np.allclose(alone.logprobs, g.logprobs, atol=1e-2)  # a 1-row product is a dot, not a GEMM tile


def test_sampling_is_seeded_and_stops_like_hf(engine, prompts):
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=24, stop=["e"])
    a, b = engine.generate(prompts, sampling, seed=5), engine.generate(prompts, sampling, seed=5)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    for g in a:
        assert g.finish_reason == "stop"
        assert g.text.endswith("e")
        assert g.text.count("e") == 1
        assert all(lp <= 0 for lp in g.logprobs)


def test_load_weights_is_seen_at_the_next_forward_and_checked_first(engine, hf, prompts):
    """New weights written into the mapped file change the very next generation, to what HF computes with them; a
    bad update is refused whole, before anything is written."""
    sampling = SamplingConfig(greedy=True, max_new_tokens=12, stop=[])
    before = engine.generate(prompts[:2], sampling)
    named = {n: p.detach().clone() for n, p in hf.model.named_parameters()}
    bad = dict(named, **{"model.layers.0.mlp.up_proj.weight": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="up_proj.weight has shape"):
        engine.load_weights(bad, 1)
    with pytest.raises(KeyError, match="no new value"):
        engine.load_weights({k: v for k, v in named.items() if "layers.5." not in k}, 1)
    with pytest.raises(KeyError, match="not a parameter"):
        engine.load_weights(dict(named, extra=torch.zeros(1)), 1)
    assert [g.token_ids for g in engine.generate(prompts[:2], sampling)] == [g.token_ids for g in before]
    assert engine.version == 0

    changed = {n: (-v if "down_proj" in n else v) for n, v in named.items()}
    other = HFEngine(model=type(hf.model)(hf.model.config).eval(), tokenizer=hf.tokenizer)
    other.load_weights(changed, 1)
    try:
        engine.load_weights(changed, 1)
        after = engine.generate(prompts[:2], sampling)
        assert engine.version == 1
        assert [g.token_ids for g in after] != [g.token_ids for g in before]
        assert [g.token_ids for g in after] == [g.token_ids for g in other.generate(prompts[:2], sampling)]
    finally:
        engine.load_weights(named, 0)
    assert [g.token_ids for g in engine.generate(prompts[:2], sampling)] == [g.token_ids for g in before]


def test_bf16_engine_is_close_and_takes_bf16_pushes(default_model_dir, hf, prompts):
    e = LlamaCppEngine(default_model_dir, dtype="bfloat16", threads=1)
    try:
        assert (e.weights_device, e.weights_dtype) == ("cpu", "bfloat16")
        g = e.generate(prompts[:1], SamplingConfig(temperature=1.0, max_new_tokens=16, stop=[]), seed=0)[0]
        diff = np.abs(np.array(g.logprobs) - teacher_forced_logprobs(hf, prompts[0], g.token_ids).numpy())
        assert diff.mean() < 0.05, diff
        e.load_weights({n: p.detach().to(torch.bfloat16) for n, p in hf.model.named_parameters()}, 3)
        again = e.generate(prompts[:1], SamplingConfig(temperature=1.0, max_new_tokens=16, stop=[]), seed=0)[0]
        assert again.token_ids == g.token_ids
        assert e.version == 3
    finally:
        e.close()


def test_bad_input_and_unsupported_models(engine, tmp_path, default_model_dir):
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[1, 2], []], SamplingConfig())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([[1, 49152]], SamplingConfig())
    assert engine.generate([], SamplingConfig()) == []
    with pytest.raises(ValueError, match="dtype 'int4'"):
        LlamaCppEngine(default_model_dir, dtype="int4")
    qwen = tmp_path / "qwen"
    qwen.mkdir()
    for f in default_model_dir.iterdir():
        (qwen / f.name).symlink_to(f)
    cfg = json.loads((default_model_dir / "config.json").read_text())
    (qwen / "config.json").unlink()
    (qwen / "config.json").write_text(json.dumps({**cfg, "attention_bias": True}))
    with pytest.raises(UnsupportedModel, match="model.engine=hf"):
        LlamaCppEngine(qwen)
    (qwen / "config.json").unlink()
    (qwen / "config.json").write_text(json.dumps(cfg))
    (qwen / "model.safetensors").unlink()
    with pytest.raises(UnsupportedModel, match="no .safetensors weights"):
        LlamaCppEngine(qwen)


def test_registered_and_built_from_the_config_leaving_no_file(default_model_dir, tmp_path, monkeypatch):
    """The GGUF file is unlinked once mapped: no directory of the engine's outlives its construction."""
    import tempfile

    made = []

    def mkdtemp(prefix: str, dir: str | None) -> str:
        made.append(tmp_path / f"{prefix}{len(made)}")
        made[-1].mkdir()
        return str(made[-1])

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    e = make_engine(ModelConfig(engine="llamacpp", dtype="float32", num_threads=1))
    try:
        assert isinstance(e, LlamaCppEngine)
        assert e.threads == 1
        assert e.max_context == 8192
        assert len(made) == 1
        assert not made[0].exists()
        assert e.generate([[1, 2, 3]], SamplingConfig(greedy=True, max_new_tokens=2))[0].token_ids
    finally:
        e.close()


@requires_deepspeed
def test_trains_in_process_with_weights_pushed_in_place(tiny_model_dir, tmp_path):
    """`ziprl.train` with model.engine=llamacpp: rollouts from llama.cpp, the learner's weights pushed into its mapped
    file after every step (the next step's trajectories carry the new version), the engine/learner log-prob gap
    measured and corrected (TIS), as for any engine that is not the learner's numerics."""
    from ziprl.config import load_config
    from ziprl.env.trajectory import load_trajectories
    from ziprl.loop.in_process import train

    cfg = load_config(None, [
        f"run.sft_checkpoint={tiny_model_dir}", f"run.out_dir={tmp_path}", "learner.steps=2", "model.engine=llamacpp",
        "rollout.group_size=2", "learner.global_batch_questions=2", "env.max_turns=2", "sampling.max_new_tokens=8",
        "model.device=cpu", "learner.beta=0.001", "data.limit=5", "learner.bf16=false"])
    last = train(cfg, progress=False)
    assert last["learner/policy_version"] == 2
    assert last["perf/gen_tokens_per_second"] > 0
    assert 0 < last["learner/mismatch_abs_mean"] < 1e-2
    assert last["learner/tis_mean"] == pytest.approx(1, abs=0.05)
    second = load_trajectories(tmp_path / "trajectories" / "step_000002.parquet")
    assert {t.policy_version for t in second} == {1}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir) -> LlamaCppEngine:
    e = LlamaCppEngine(tiny_model_dir, dtype="float32", threads=1)
    yield e
    e.close()


@settings(max_examples=30, deadline=None)
@given(prefix=st.lists(st.integers(0, 49151), max_size=6),
       own=st.lists(st.lists(st.integers(0, 49151), max_size=9), min_size=1, max_size=5),
       new=st.integers(1, 6), stop=st.sampled_from([[], ["a"], ["</search>", "\n"]]))
def test_any_prompts_get_their_own_generation(tiny, prefix, own, new, stop):
    """Prompts of any valid token ids and lengths, sharing a prefix or not, rows ending at different steps: one
    generation per prompt, at most ``new`` tokens, finite log-probs <= 0, and each row as it is alone."""
    prompts = [prefix + o for o in own if prefix + o] or [[0]]
    sampling = SamplingConfig(greedy=True, max_new_tokens=new, stop=stop)
    out = tiny.generate(prompts, sampling)
    assert [g.prompt_ids for g in out] == prompts
    for g, p in zip(out, prompts, strict=True):
        assert 1 <= len(g.token_ids) == len(g.logprobs) <= new
        assert g.finish_reason in ("stop", "length")
        assert all(np.isfinite(x) and x <= 1e-6 for x in g.logprobs)
        assert g.finish_reason == "length" or g.token_ids[-1] in tiny.eos_ids or any(s in g.text for s in stop)
        alone = tiny.generate([p], sampling)[0]
        assert alone.token_ids == g.token_ids
        assert np.allclose(alone.logprobs, g.logprobs, atol=1e-2)


def test_an_engine_left_to_interpreter_exit_closes_quietly(tiny_model_dir):
    """An engine still referenced when the interpreter exits (a script's global) is not closed then, and its
    ``__del__`` raises nothing, though its module's globals (``sys``) may be gone by then: here the script's alias
    of the module is its last reference, and the module's dictionary is cleared before the engine is freed."""
    import subprocess
    import sys

    script = ("from ziprl.policy.engines.llamacpp.engine import LlamaCppEngine\n"
              "import ziprl.policy.engines.llamacpp.engine as module\n"
              f"engine = LlamaCppEngine({str(tiny_model_dir)!r}, dtype='float32', threads=1)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    assert "Error" not in done.stderr, done.stderr
