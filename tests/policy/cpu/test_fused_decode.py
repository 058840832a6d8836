"""Fused decode steps on CPU (ziprl/policy/cpu/fused_decode.py), bfloat16 (AVX-512 BF16) and float32 (AVX2 + FMA): the
model's numbers, rows independent, the KV cache written in place and grown, new weights repacked in place, the kernel
chosen by the CPU's flags, and the model's own forward wherever none can run."""

from __future__ import annotations

import copy
import shutil
import subprocess

import numpy as np
import pytest
import torch

import ziprl.policy.cpu.fused_decode as fused
from tests.conftest import REPO
from ziprl.config import SamplingConfig
from ziprl.policy import HFEngine
from ziprl.policy.cpu.fused_decode import (
    BF16,
    F32_AVX2,
    KERNELS,
    FusedDecode,
    build_dir,
    cpu_runs,
    dtype_name,
    extension,
    fused_decode,
    kernel_for,
    unsupported,
)
from ziprl.policy.kv import cache_kwarg
from ziprl.policy.models import load_model

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

PROMPTS = [[1, 9038, 2030, 253, 1012, 28, 2], [1, 9038, 504, 2], [1, 9038, 2030, 5021, 338, 1464, 7100, 30, 216, 2]]
CHAT = ("What is the capital of France?", "Name a prime number.", "Who wrote Hamlet, and when was it written?")


def built(kernel):
    """``kernel``'s compiled extension; the test skips (with the reason) where it cannot build or run."""
    if not cpu_runs(kernel):
        pytest.skip(f"this CPU lacks {' + '.join(kernel.cpu_flags)} for {kernel.name}")
    try:
        return extension(kernel)
    except Exception as err:
        pytest.skip(f"{kernel.name} did not build here: {err}")


def only_avx2(monkeypatch) -> None:
    """This CPU as one with AVX2 and FMA but no AVX-512 BF16 (AMD Zen 3, most laptops), to the dispatcher."""
    monkeypatch.setattr(fused, "cpu_flags", lambda: frozenset({"avx2", "fma", "avx"}))


@pytest.fixture(params=KERNELS, ids=lambda k: k.name)
def kernel(request, monkeypatch):
    """Each kernel this CPU runs, the engine's dispatch made to choose it (float32 AVX2 also on an AVX-512 CPU)."""
    built(request.param)
    if request.param is F32_AVX2:
        only_avx2(monkeypatch)
    return request.param


def engine_of(path, kernel, **kw) -> HFEngine:
    return HFEngine(path, dtype=dtype_name(kernel.dtype), device="cpu", **kw)


def prefill(engine: HFEngine, prompts: list[list[int]], room: int):
    """Last logits' greedy tokens, the KV cache, the mask with the next column, and the next positions."""
    with torch.inference_mode():
        logits, cache, mask, pos = engine._prefill(prompts, room=room)
    return logits.float().argmax(-1), cache, torch.cat([mask, mask.new_ones((len(prompts), 1))], 1), pos


def model_step(model, tok, pos, mask, cache) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=tok[:, None], attention_mask=mask, position_ids=pos[:, None], use_cache=True,
                     **{cache_kwarg(model): cache}).logits[:, -1].float()


def test_a_fused_step_is_as_near_the_float32_model_as_the_bf16_forward(default_model_dir):
    """One step of SmolLM2-135M over padded rows of unequal length: against the float32 model of the same (bf16)
    weights, the fused step's log-probs are no further off than the bf16 model's own forward, every row picks the same
    token, and the keys and values it writes into the cache are the forward's, to bf16 rounding."""
    built(BF16)
    engine = engine_of(default_model_dir, BF16)
    assert engine.fused_decode is not None
    assert engine.fused_decode.kernel is BF16
    assert engine.packed_linears
    chat = [engine.encode_chat([{"role": "user", "content": q}]) for q in CHAT]
    tok, cache, mask, pos = prefill(engine, chat, room=4)
    ref_cache = copy.deepcopy(cache)
    bf16 = model_step(engine.model, tok, pos, mask, ref_cache)
    with torch.inference_mode():
        fused_logits = engine.fused_decode(tok, pos, mask, cache)
    full = load_model(default_model_dir, dtype="float32", device="cpu")
    full.load_state_dict({k: v.float() for k, v in engine.model.state_dict().items()})
    with torch.inference_mode():
        exact = torch.stack([full(input_ids=torch.tensor([p + [int(t)]])).logits[0, -1].float()
                             for p, t in zip(chat, tok, strict=True)])

    def off(logits: torch.Tensor) -> float:  # E_p |delta log p| under the float32 model
        p = exact.softmax(-1)
        return float((p * (logits.log_softmax(-1) - exact.log_softmax(-1)).abs()).sum(-1).mean())

    assert torch.equal(fused_logits.argmax(-1), exact.argmax(-1))
    assert off(fused_logits) <= 1.5 * off(bf16) + 1e-3, (off(fused_logits), off(bf16))
    for mine, theirs in zip(cache.layers, ref_cache.layers, strict=True):
        assert mine.keys.shape == theirs.keys.shape
        assert mine._length == theirs._length
        for a, b in ((mine.keys, theirs.keys), (mine.values, theirs.values)):
            new, want = a[:, :, -1].float(), b[:, :, -1].float()
            assert (new - want).abs().max() <= 0.02 * want.abs().max() + 0.02
            assert torch.equal(a[:, :, :-1], b[:, :, :-1])  # the other columns untouched


def test_an_avx2_float32_step_is_the_float32_forward(default_model_dir, monkeypatch):
    """Three steps of SmolLM2-135M in float32 over padded rows of unequal length, the AVX2 kernel on its own cache and
    the model's forward on a copy: every row picks the forward's token, every log-prob of the vocabulary is within
    1e-4 of the forward's, and the keys and values written are the forward's to float32 rounding (the prompt's
    columns untouched)."""
    built(F32_AVX2)
    only_avx2(monkeypatch)
    engine = engine_of(default_model_dir, F32_AVX2)
    assert engine.fused_decode is not None
    assert engine.fused_decode.kernel is F32_AVX2
    chat = [engine.encode_chat([{"role": "user", "content": q}]) for q in CHAT]
    tok, cache, mask, pos = prefill(engine, chat, room=2)
    ref_cache, prompt = copy.deepcopy(cache), cache.layers[0]._length
    for _ in range(3):
        want = model_step(engine.model, tok, pos, mask, ref_cache)
        with torch.inference_mode():
            got = engine.fused_decode(tok, pos, mask, cache)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        assert (got.log_softmax(-1) - want.log_softmax(-1)).abs().max() <= 1e-4
        for mine, theirs in zip(cache.layers, ref_cache.layers, strict=True):
            assert mine.keys.shape == theirs.keys.shape
            assert mine._length == theirs._length
            for a, b in ((mine.keys, theirs.keys), (mine.values, theirs.values)):
                new, want_new = a[:, :, prompt:], b[:, :, prompt:]
                assert (new - want_new).abs().max() <= 1e-5 * want_new.abs().max()
                assert torch.equal(a[:, :, :prompt], b[:, :, :prompt])
        tok, pos = want.argmax(-1), pos + 1
        mask = torch.cat([mask, mask.new_ones((len(chat), 1))], 1)


def test_each_row_computes_exactly_as_it_would_alone(kernel, tiny_model_dir):
    """Eleven rows (a block of eight and one of three) give each row the logits and cache column it gets alone."""
    engine = engine_of(tiny_model_dir, kernel)
    assert engine.fused_decode.kernel is kernel
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


def test_a_full_cache_grows_and_decodes_as_one_with_room(kernel, tiny_model_dir):
    engine = engine_of(tiny_model_dir, kernel)
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
    assert torch.equal(runs[0][1], runs[1][1])
    assert runs[0][1].shape[2] == mask.shape[1] - 1


def test_generation_follows_new_weights(kernel, tiny_model_dir, tmp_path):
    """After load_weights the fused steps compute with the new weights, repacked into the same buffers: the engine
    generates what an engine built from a checkpoint of those weights generates, token for token, and log-probs
    within 1e-5 (on an AMD EPYC with AVX-512 BF16 the float32 prefill of the two engines differed by ~1e-6, with the
    new arrays 64-byte aligned or not; old weights move them by far more, as the last check shows)."""
    engine = engine_of(tiny_model_dir, kernel)
    packed = [w.data_ptr() for w in engine.fused_decode.weights if w.dim() == 4]
    rng = np.random.default_rng(0)
    new = {k: (v.detach().float().numpy() + rng.normal(0, 0.05, v.shape)).astype(np.float32)
           for k, v in engine.model.named_parameters()}
    engine.load_weights(new, version=1)
    assert [w.data_ptr() for w in engine.fused_decode.weights if w.dim() == 4] == packed
    moved = load_model(tiny_model_dir, dtype="float32", device="cpu")
    moved.load_state_dict({k: torch.from_numpy(v) for k, v in new.items()}, strict=False)
    moved.save_pretrained(tmp_path)
    engine.tokenizer.save_pretrained(tmp_path)
    fresh = engine_of(tmp_path, kernel)
    assert fresh.fused_decode.kernel is kernel
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=12, stop=[])
    for a, b in zip(engine.generate(PROMPTS, sampling, seed=3), fresh.generate(PROMPTS, sampling, seed=3), strict=True):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-5)
    stale = engine_of(tiny_model_dir, kernel)
    assert [g.logprobs for g in stale.generate(PROMPTS, sampling, seed=3)] != [
        g.logprobs for g in fresh.generate(PROMPTS, sampling, seed=3)]


def test_a_token_outside_the_vocabulary_or_a_row_hiding_its_own_column_is_refused(kernel, tiny_model_dir):
    engine = engine_of(tiny_model_dir, kernel)
    tok, cache, mask, pos = prefill(engine, PROMPTS, room=2)
    with pytest.raises(RuntimeError, match="has token 49152"), torch.inference_mode():
        engine.fused_decode(torch.tensor([1, 49152, 3]), pos, mask, cache)
    hidden = mask.clone()
    hidden[2, -1] = 0
    with pytest.raises(RuntimeError, match="row 2's mask leaves out its own new column"), torch.inference_mode():
        engine.fused_decode(tok, pos, hidden, cache)


def test_the_kernel_is_chosen_by_the_cpus_flags_and_the_models_dtype(tiny_model_dir, monkeypatch):
    """AVX-512 BF16 runs a bfloat16 model; without it, AVX2 + FMA runs a float32 one (the engine in float32 picks it);
    anything else keeps the model's forward and says why."""
    built(F32_AVX2)
    f32 = load_model(tiny_model_dir, dtype="float32", device="cpu")
    bf16 = load_model(tiny_model_dir, dtype="bfloat16", device="cpu")
    monkeypatch.setattr(fused, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16", "avx2", "fma"}))
    assert kernel_for(bf16) == (BF16, None)
    assert kernel_for(f32)[0] is None
    assert "only a bfloat16 model" in kernel_for(f32)[1]
    only_avx2(monkeypatch)
    assert kernel_for(f32) == (F32_AVX2, None)
    assert kernel_for(bf16)[0] is None
    assert "only a float32 model" in kernel_for(bf16)[1]
    engine = HFEngine(tiny_model_dir, dtype="bfloat16", device="cpu")
    assert engine.fused_decode is None
    assert "only a float32 model" in engine.fused_decode_off
    monkeypatch.setattr(fused, "cpu_flags", lambda: frozenset({"avx", "sse4_2"}))
    assert kernel_for(f32) == (None, "this CPU has neither AVX-512 BF16 nor AVX2 with FMA")
    assert HFEngine(tiny_model_dir, dtype="float32", device="cpu").fused_decode_off == kernel_for(f32)[1]
    only_avx2(monkeypatch)
    engine = HFEngine(tiny_model_dir, dtype="float32", device="cpu")
    assert engine.fused_decode.kernel is F32_AVX2
    assert engine.fused_decode_off is None


def test_the_avx2_kernel_has_no_avx512_instructions():
    """The float32 kernel runs on CPUs without AVX-512 (AMD Zen 3): its build uses no 512-bit or EVEX-only
    registers."""
    built(F32_AVX2)
    if shutil.which("objdump") is None:
        pytest.skip("no objdump here")
    code = subprocess.run(["objdump", "-d", str(build_dir(F32_AVX2) / f"{F32_AVX2.name}.so")], capture_output=True,
                          text=True, check=True).stdout
    assert "ymm" in code
    for register in ("zmm", "%k1", "ymm16", "ymm31", "xmm16", "xmm31"):
        assert register not in code


def test_elsewhere_the_model_forward_decodes_and_says_why(tiny_model_dir):
    off = HFEngine(tiny_model_dir, dtype="float32", device="cpu", fused_decode=False)
    assert off.fused_decode is None
    assert off.fused_decode_off == "fused_decode=False"
    given = HFEngine(model=load_model(tiny_model_dir, dtype="bfloat16", device="cpu"), tokenizer=off.tokenizer)
    assert given.fused_decode is None
    assert given.fused_decode_off == "given a loaded model"
    bf16 = load_model(tiny_model_dir, dtype="bfloat16", device="cpu")
    bf16.config.mlp_bias = True
    assert "biases" in unsupported(bf16)
    assert fused_decode(bf16) == (None, unsupported(bf16))
    with pytest.raises(ValueError, match="decodes a float32 model, not bfloat16"):
        FusedDecode(bf16, F32_AVX2, None)


def test_a_cache_it_cannot_write_goes_to_the_model_forward(kernel, tiny_model_dir):
    """``usable`` is false for a cache of plain layers (no room), so generate takes the model's forward for it."""
    engine = engine_of(tiny_model_dir, kernel, fused_decode=False)
    fused_step = FusedDecode(engine.model, kernel, extension(kernel))
    tok, cache, mask, pos = prefill(engine, PROMPTS, room=2)
    assert fused_step.usable(cache)
    from transformers import DynamicCache

    assert not fused_step.usable(DynamicCache(config=engine.model.config))


def test_the_package_ships_the_sources_it_builds():
    """The C++ sources are package data (a wheel without them could not build the extensions)."""
    import fnmatch
    import tomllib

    root = REPO
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["ziprl"]
    for kernel in KERNELS:
        shipped = kernel.source.relative_to(root / "ziprl").as_posix()
        assert kernel.source.is_file(), (shipped, patterns)
        assert any(fnmatch.fnmatch(shipped, p) for p in patterns), (shipped, patterns)


def test_the_build_stays_in_the_environment_whatever_deepspeed_sets(monkeypatch, tmp_path):
    """Importing DeepSpeed points ``TORCH_EXTENSIONS_DIR`` at the ZipRL cache: the extensions must not follow it (a
    fresh cache would rebuild them, ~30 s each, where setup.sh already built them in the environment)."""
    import os
    import sys
    from pathlib import Path

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    for kernel in KERNELS:
        assert tmp_path not in build_dir(kernel).parents
        if os.access(sys.prefix, os.W_OK):
            assert Path(sys.prefix) in build_dir(kernel).parents
    assert len({build_dir(k) for k in KERNELS}) == len(KERNELS)  # one build each: one failing leaves the other


def test_a_build_killed_mid_way_does_not_block_the_next(monkeypatch, tmp_path, capsys):
    """torch's build lock (``lock`` in the build directory) outlives a build that was killed, and every later
    ``load`` would wait on it for ever; the next build, holding ZipRL's own lock, removes it and builds."""
    import dataclasses

    kernel = dataclasses.replace(KERNELS[0], name="ziprl_test_kernel")
    monkeypatch.setattr(fused, "build_dir", lambda k: tmp_path / k.name)
    (tmp_path / kernel.name).mkdir()
    (tmp_path / kernel.name / "lock").touch()  # what a killed build leaves
    built = []

    def load(name, build_directory, **kwargs):
        if (tmp_path / name / "lock").exists():
            raise AssertionError("torch would wait on the stale lock for ever")
        built.append(name)
        return name

    monkeypatch.setattr("torch.utils.cpp_extension.load", load)
    assert fused.extension(kernel) == "ziprl_test_kernel" and built == ["ziprl_test_kernel"]
    assert "left by a build that was stopped" in capsys.readouterr().err
