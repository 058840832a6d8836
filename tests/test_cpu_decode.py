"""Fused bf16 decode steps on CPU (ziprl/policy/cpu_decode.py): the model's numbers, rows independent, the KV cache
written in place and grown, new weights repacked, and the model's own forward wherever it cannot run."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from ziprl.config import SamplingConfig
from ziprl.policy import HFEngine
from ziprl.policy.cpu_decode import FusedDecode, cpu_has_avx512_bf16, fused_decode, unsupported
from ziprl.policy.kv import cache_kwarg
from ziprl.policy.models import load_model

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
needs_bf16 = pytest.mark.skipif(not cpu_has_avx512_bf16(), reason="this CPU has no AVX-512 BF16")

PROMPTS = [[1, 9038, 2030, 253, 1012, 28, 2], [1, 9038, 504, 2], [1, 9038, 2030, 5021, 338, 1464, 7100, 30, 216, 2]]


@pytest.fixture(scope="module")
def built():
    """The compiled extension; the tests skip (with the reason) where it cannot build or run."""
    if not cpu_has_avx512_bf16():
        pytest.skip("this CPU has no AVX-512 BF16")
    from ziprl.policy import cpu_decode

    try:
        return cpu_decode._extension()
    except Exception as err:
        pytest.skip(f"the extension did not build here: {err}")


def engine_of(path, **kw) -> HFEngine:
    return HFEngine(path, dtype="bfloat16", device="cpu", **kw)


def prefill(engine: HFEngine, prompts: list[list[int]], room: int):
    """Last logits' greedy tokens, the KV cache, the mask with the next column, and the next positions."""
    with torch.inference_mode():
        logits, cache, mask, pos = engine._prefill(prompts, room=room)
    return logits.float().argmax(-1), cache, torch.cat([mask, mask.new_ones((len(prompts), 1))], 1), pos


def model_step(model, tok, pos, mask, cache) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=tok[:, None], attention_mask=mask, position_ids=pos[:, None], use_cache=True,
                     **{cache_kwarg(model): cache}).logits[:, -1].float()


def test_a_fused_step_is_as_near_the_float32_model_as_the_bf16_forward(built, default_model_dir):
    """One step of SmolLM2-135M over padded rows of unequal length: against the float32 model of the same (bf16)
    weights, the fused step's log-probs are no further off than the bf16 model's own forward, every row picks the same
    token, and the keys and values it writes into the cache are the forward's, to bf16 rounding."""
    engine = engine_of(default_model_dir)
    assert engine.fused_decode is not None and engine.packed_linears
    chat = [engine.encode_chat([{"role": "user", "content": q}]) for q in
            ("What is the capital of France?", "Name a prime number.", "Who wrote Hamlet, and when was it written?")]
    tok, cache, mask, pos = prefill(engine, chat, room=4)
    ref_cache = copy.deepcopy(cache)
    bf16 = model_step(engine.model, tok, pos, mask, ref_cache)
    with torch.inference_mode():
        fused = engine.fused_decode(tok, pos, mask, cache)
    full = load_model(default_model_dir, dtype="float32", device="cpu")
    full.load_state_dict({k: v.float() for k, v in engine.model.state_dict().items()})
    with torch.inference_mode():
        exact = torch.stack([full(input_ids=torch.tensor([p + [int(t)]])).logits[0, -1].float()
                             for p, t in zip(chat, tok, strict=True)])

    def off(logits: torch.Tensor) -> float:  # E_p |delta log p| under the float32 model
        p = exact.softmax(-1)
        return float((p * (logits.log_softmax(-1) - exact.log_softmax(-1)).abs()).sum(-1).mean())

    assert torch.equal(fused.argmax(-1), exact.argmax(-1))
    assert off(fused) <= 1.5 * off(bf16) + 1e-3, (off(fused), off(bf16))
    for mine, theirs in zip(cache.layers, ref_cache.layers, strict=True):
        assert mine.keys.shape == theirs.keys.shape and mine._length == theirs._length
        for a, b in ((mine.keys, theirs.keys), (mine.values, theirs.values)):
            new, want = a[:, :, -1].float(), b[:, :, -1].float()
            assert (new - want).abs().max() <= 0.02 * want.abs().max() + 0.02
            assert torch.equal(a[:, :, :-1], b[:, :, :-1])  # the other columns untouched


@needs_bf16
def test_each_row_computes_exactly_as_it_would_alone(built, tiny_model_dir):
    """Eleven rows (a block of eight and one of three) give each row the logits and cache column it gets alone."""
    engine = engine_of(tiny_model_dir)
    prompts = [PROMPTS[i % 3][: 3 + i % 5] for i in range(11)]
    tok, cache, mask, pos = prefill(engine, prompts, room=2)
    alone = []
    for i in range(len(prompts)):
        one = copy.deepcopy(cache)
        one.batch_select_indices(torch.tensor([i]))
        with torch.inference_mode():
            alone.append((engine.fused_decode(tok[i:i + 1], pos[i:i + 1], mask[i:i + 1], one), one))
    with torch.inference_mode():
        together = engine.fused_decode(tok, pos, mask, cache)
    for i, (logits, one) in enumerate(alone):
        assert torch.equal(together[i], logits[0])
        assert torch.equal(cache.layers[1].keys[i], one.layers[1].keys[0])


@needs_bf16
def test_a_full_cache_grows_and_decodes_as_one_with_room(built, tiny_model_dir):
    engine = engine_of(tiny_model_dir)
    runs = []
    for room in (1, 8):
        tok, cache, mask, pos = prefill(engine, PROMPTS, room=room)
        steps = []
        with torch.inference_mode():
            for _ in range(4):
                logits = engine.fused_decode(tok, pos, mask, cache)
                steps.append(logits)
                tok, pos = logits.argmax(-1), pos + 1
                mask = torch.cat([mask, mask.new_ones((len(PROMPTS), 1))], 1)
        runs.append((steps, cache.layers[0].keys))
    assert all(torch.equal(a, b) for a, b in zip(runs[0][0], runs[1][0], strict=True))
    assert torch.equal(runs[0][1], runs[1][1]) and runs[0][1].shape[2] == mask.shape[1] - 1


@needs_bf16
def test_generation_follows_new_weights(built, tiny_model_dir, tmp_path):
    """After load_weights the fused steps compute with the new weights: the engine generates what an engine built
    from a checkpoint of those weights generates, token for token and log-prob for log-prob."""
    engine = engine_of(tiny_model_dir)
    rng = np.random.default_rng(0)
    new = {k: (v.detach().float().numpy() + rng.normal(0, 0.05, v.shape)).astype(np.float32)
           for k, v in engine.model.named_parameters()}
    engine.load_weights(new, version=1)
    moved = load_model(tiny_model_dir, dtype="float32", device="cpu")
    moved.load_state_dict({k: torch.from_numpy(v) for k, v in new.items()}, strict=False)
    moved.save_pretrained(tmp_path)
    engine.tokenizer.save_pretrained(tmp_path)
    fresh = engine_of(tmp_path)
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=12, stop=[])
    for a, b in zip(engine.generate(PROMPTS, sampling, seed=3), fresh.generate(PROMPTS, sampling, seed=3), strict=True):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    stale = engine_of(tiny_model_dir)
    assert [g.logprobs for g in stale.generate(PROMPTS, sampling, seed=3)] != [
        g.logprobs for g in fresh.generate(PROMPTS, sampling, seed=3)]


@needs_bf16
def test_a_token_outside_the_vocabulary_or_a_row_hiding_its_own_column_is_refused(built, tiny_model_dir):
    engine = engine_of(tiny_model_dir)
    tok, cache, mask, pos = prefill(engine, PROMPTS, room=2)
    with pytest.raises(RuntimeError, match="has token 49152"), torch.inference_mode():
        engine.fused_decode(torch.tensor([1, 49152, 3]), pos, mask, cache)
    hidden = mask.clone()
    hidden[2, -1] = 0
    with pytest.raises(RuntimeError, match="row 2's mask leaves out its own new column"), torch.inference_mode():
        engine.fused_decode(tok, pos, hidden, cache)


def test_elsewhere_the_model_forward_decodes_and_says_why(tiny_model_dir):
    full = HFEngine(tiny_model_dir, dtype="float32", device="cpu")
    assert full.fused_decode is None and "float32" in full.fused_decode_off
    off = engine_of(tiny_model_dir, fused_decode=False)
    assert off.fused_decode is None and off.fused_decode_off == "fused_decode=False"
    given = HFEngine(model=load_model(tiny_model_dir, dtype="bfloat16", device="cpu"), tokenizer=full.tokenizer)
    assert given.fused_decode is None and given.fused_decode_off == "given a loaded model"
    bf16 = load_model(tiny_model_dir, dtype="bfloat16", device="cpu")
    bf16.config.mlp_bias = True
    assert "biases" in unsupported(bf16)
    assert fused_decode(full.model) == (None, unsupported(full.model))
    if not cpu_has_avx512_bf16():
        assert unsupported(load_model(tiny_model_dir, dtype="bfloat16", device="cpu")) == "this CPU has no AVX-512 BF16"


def test_a_cache_it_cannot_write_goes_to_the_model_forward(built, tiny_model_dir):
    """``usable`` is false for a cache of plain layers (no room), so generate takes the model's forward for it."""
    engine = engine_of(tiny_model_dir, fused_decode=False)
    fused = FusedDecode(engine.model, built)
    tok, cache, mask, pos = prefill(engine, PROMPTS, room=2)
    assert fused.usable(cache)
    from transformers import DynamicCache

    assert not fused.usable(DynamicCache(config=engine.model.config))


def test_the_package_ships_the_source_it_builds():
    """The C++ source is package data (a wheel without it could not build the extension)."""
    import fnmatch
    import tomllib
    from pathlib import Path

    from ziprl.policy.cpu_decode import SOURCE

    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["ziprl"]
    shipped = SOURCE.relative_to(root / "ziprl").as_posix()
    assert SOURCE.is_file() and any(fnmatch.fnmatch(shipped, p) for p in patterns), (shipped, patterns)


def test_the_build_stays_in_the_environment_whatever_deepspeed_sets(monkeypatch, tmp_path):
    """Importing DeepSpeed points ``TORCH_EXTENSIONS_DIR`` at the ZipRL cache: the extension must not follow it (a
    fresh cache would rebuild it, ~30 s, where setup.sh already built it in the environment)."""
    import os
    import sys
    from pathlib import Path

    from ziprl.policy.cpu_decode import build_dir

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert tmp_path not in build_dir().parents
    if os.access(sys.prefix, os.W_OK):
        assert Path(sys.prefix) in build_dir().parents
