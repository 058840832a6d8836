"""HFEngine on the real default model: behaviour log-probs, padding, determinism, stops, weight updates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ziprl.config import ModelConfig, SamplingConfig
from ziprl.policy import HFEngine, make_engine, resolve_model_path
from ziprl.policy.decoding import sample
from ziprl.testing.engines import teacher_forced_logprobs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

QUESTIONS = ["What is the capital of France?", "Write a long poem about the sea, the sky and the wind.", "Hi"]


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    return HFEngine(resolve_model_path(ModelConfig()), device="cpu")


@pytest.fixture(scope="module")
def prompts(engine) -> list[list[int]]:
    return [engine.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]


def test_logprobs_equal_teacher_forced_pass_for_padded_batch(engine, prompts):
    assert len({len(p) for p in prompts}) == len(prompts)  # different lengths -> left padding in play
    sampling = SamplingConfig(temperature=0.8, top_p=0.95, max_new_tokens=24, stop=[])
    out = engine.generate(prompts, sampling, seed=1)
    for g, p in zip(out, prompts, strict=True):
        assert g.prompt_ids == p
        assert len(g.logprobs) == len(g.token_ids) >= 1
        ref = teacher_forced_logprobs(engine, p, g.token_ids)
        assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4, rtol=0)


def test_greedy_is_deterministic_and_equals_model_generate(engine, prompts):
    sampling = SamplingConfig(greedy=True, max_new_tokens=20, stop=[])
    a = engine.generate(prompts, sampling)
    b = engine.generate(prompts, sampling, seed=123)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[engine.pad_id] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    with torch.inference_mode():
        ref = engine.model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                                    pad_token_id=engine.pad_id)[:, width:].tolist()
    for g, row in zip(a, ref, strict=True):
        assert g.token_ids == row[: len(g.token_ids)]
        if g.finish_reason == "stop":
            assert g.token_ids[-1] in engine.eos_ids
    short = a[0]  # "The capital of France is Paris." then EOS: kept in ids, not in text
    assert short.finish_reason == "stop"
    assert short.token_ids[-1] in engine.eos_ids
    assert "Paris" in short.text
    assert "<|im_end|>" not in short.text


def test_seeded_sampling_is_reproducible(engine, prompts):
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=12, stop=[])
    a = engine.generate(prompts, sampling, seed=7)
    b = engine.generate(prompts, sampling, seed=7)
    c = engine.generate(prompts, sampling, seed=8)
    assert [(g.token_ids, g.logprobs) for g in a] == [(g.token_ids, g.logprobs) for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_stop_string_cuts_right_after_the_closing_tag(engine):
    tok = engine.tokenizer
    # A repeated pattern the model continues; the prompt ends mid-tag so the next thing is a closing tag.
    prefix = "<search>apple</search>\n<search>banana</search>\n<search>cherry</search>\n<search>grape"
    prompt = tok(prefix)["input_ids"]
    sampling = SamplingConfig(greedy=True, max_new_tokens=16)  # default stops: </search>, </open>, </answer>
    (g,) = engine.generate([prompt], sampling)
    assert g.finish_reason == "stop"
    assert g.text.endswith("</search>")
    assert "</search>" in tok.decode(g.token_ids)
    assert "</search>" not in tok.decode(g.token_ids[:-1])
    (free,) = engine.generate([prompt], SamplingConfig(greedy=True, max_new_tokens=16, stop=[]))
    assert free.token_ids[: len(g.token_ids)] == g.token_ids
    assert len(free.token_ids) > len(g.token_ids)
    # The earliest-completed stop string wins, even when listed last.
    (h,) = engine.generate([prompt], SamplingConfig(greedy=True, max_new_tokens=16, stop=["</open>", "</"]))
    assert h.text.endswith("</")
    assert len(h.token_ids) <= len(g.token_ids)
    # A stop string ending inside a token: the token is kept, the text is cut right after the string.
    (m,) = engine.generate([prompt], SamplingConfig(greedy=True, max_new_tokens=16, stop=["sear"]))
    assert m.text == "</sear"
    assert tok.decode(m.token_ids) == "</search"


def test_max_new_tokens_gives_length(engine, prompts):
    out = engine.generate(prompts[1:2], SamplingConfig(temperature=0.8, max_new_tokens=5, stop=[]), seed=0)
    assert out[0].finish_reason == "length"
    assert len(out[0].token_ids) == len(out[0].logprobs) == 5


def test_counters_and_edge_cases(engine, prompts):
    before = engine.tokens_generated
    out = engine.generate(prompts[:1], SamplingConfig(greedy=True, max_new_tokens=3, stop=[]))
    assert engine.tokens_generated == before + len(out[0].token_ids)
    assert engine.generation_seconds > engine.prefill_seconds > 0  # the prefill is timed as a part of generation
    assert engine.tokens_per_second > 0
    assert engine.generate([], SamplingConfig()) == []
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], SamplingConfig())


def test_encode_chat_ends_with_generation_prompt(engine):
    ids = engine.encode_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert all(isinstance(i, int) for i in ids)
    assert engine.tokenizer.decode(ids).endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_load_weights_changes_outputs_and_rejects_bad_input(engine, prompts):
    sampling = SamplingConfig(greedy=True, max_new_tokens=8, stop=[])
    original = {k: v.detach().numpy().copy() for k, v in engine.model.state_dict().items()}
    base = engine.generate(prompts[:1], sampling)[0]
    try:
        changed = dict(original)
        changed["model.norm.weight"] = -original["model.norm.weight"]  # flips every logit's sign
        for bad, err in [({**changed, "model.nope.weight": np.zeros(3)}, KeyError),
                         ({**changed, "model.norm.weight": np.zeros(3, np.float32)}, ValueError),
                         ({k: v for k, v in changed.items() if k != "model.layers.0.mlp.up_proj.weight"}, KeyError)]:
            with pytest.raises(err):
                engine.load_weights(bad, version=99)
        assert engine.version == 0
        assert engine.generate(prompts[:1], sampling)[0].token_ids == base.token_ids
        engine.load_weights(changed, version=1)
        assert engine.version == 1
        assert engine.generate(prompts[:1], sampling)[0].token_ids != base.token_ids
        # Tied embeddings: either name alone updates both.
        untied = {k: v for k, v in original.items() if k != "lm_head.weight"}
        engine.load_weights({k: torch.from_numpy(v) for k, v in untied.items()}, version=2)
        assert engine.version == 2
        assert engine.generate(prompts[:1], sampling)[0].token_ids == base.token_ids
    finally:
        engine.load_weights(original, version=0)


def test_load_weights_uses_same_dtype_cpu_arrays_in_place(engine, prompts):
    sampling = SamplingConfig(greedy=True, max_new_tokens=4, stop=[])
    original = {k: v.detach().numpy().copy() for k, v in engine.model.state_dict().items()}
    base = engine.generate(prompts[:1], sampling)[0].token_ids
    try:
        shared = {k: v.copy() for k, v in original.items()}
        for v in shared.values():
            v.flags.writeable = False  # as ray.get returns object-store arrays
        engine.load_weights(shared, version=3)
        norm = engine.model.model.norm.weight
        assert norm.data_ptr() == shared["model.norm.weight"].ctypes.data  # aliased, not copied
        assert engine.generate(prompts[:1], sampling)[0].token_ids == base
        widened = {k: v.astype(np.float64) for k, v in original.items()}
        widened["model.norm.weight"] = -widened["model.norm.weight"]
        engine.load_weights(widened, version=4)  # another dtype: cast into fresh memory
        assert engine.model.model.norm.weight.dtype == torch.float32
        assert torch.equal(engine.model.model.norm.weight, torch.from_numpy(-original["model.norm.weight"]))
        np.testing.assert_array_equal(shared["model.norm.weight"], original["model.norm.weight"])  # untouched
        assert engine.generate(prompts[:1], sampling)[0].token_ids != base
    finally:
        engine.load_weights(original, version=0)


def test_make_engine_builds_hf_engine(engine):
    built = make_engine(ModelConfig(device="cpu"))
    assert isinstance(built, HFEngine)
    assert built.device.type == "cpu"


@pytest.mark.parametrize("share_prefix", [True, False])
@pytest.mark.parametrize("unpadded", [True, False])
def test_prefill_variants_change_nothing(engine, prompts, monkeypatch, share_prefix, unpadded):
    """The prompts' common system prompt prefilled once for the batch, and the rows' own tokens prefilled one row at
    a time without padding: same greedy tokens and log-probs as one padded batch forward over everything. The LM
    head reads contiguous batches in every variant."""
    from ziprl.policy import kv
    from ziprl.policy.engines.hf import engine as hf_engine

    calls = []
    monkeypatch.setattr(hf_engine, "prefix_cache", lambda m, ids, *a: calls.append(("prefix", ids.shape[1])) or
                        kv.prefix_cache(m, ids, *a))
    monkeypatch.setattr(hf_engine, "stack_rows", lambda c, s, *a: calls.append(("rows", len(c), s)) or
                        kv.stack_rows(c, s, *a))
    monkeypatch.setattr(hf_engine, "UNPADDED_MIN_PADDING", 0.0)  # row by row whenever there is padding at all
    sampling = SamplingConfig(greedy=True, max_new_tokens=16, stop=[])
    monkeypatch.setattr(engine, "share_prefix", False)
    monkeypatch.setattr(engine, "unpadded_prefill", False)
    plain = engine.generate(prompts, sampling)
    assert calls == []
    monkeypatch.setattr(engine, "share_prefix", share_prefix)
    monkeypatch.setattr(engine, "unpadded_prefill", unpadded)
    head_inputs = []  # on a strided batch torch's CPU linear copies a frozen head per row (826 vs 9 ms, bf16, b8)
    hook = engine.model.lm_head.register_forward_pre_hook(lambda mod, args: head_inputs.append(args[0]))
    try:
        got = engine.generate(prompts, sampling)
    finally:
        hook.remove()
    assert head_inputs
    assert all(h.is_contiguous() for h in head_inputs)
    s = kv.shared_prefix_len(prompts) if share_prefix else 0
    assert s > 10 or not share_prefix  # the template's system prompt
    assert calls == ([("rows", len(prompts), s)] if unpadded else [("prefix", s)] if share_prefix else [])
    assert [g.token_ids for g in got] == [g.token_ids for g in plain]
    for a, b in zip(got, plain, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_a_prompt_given_more_than_once_is_prefilled_once(engine, prompts, monkeypatch):
    """GRPO's G samples of a prompt: each distinct prompt is prefilled once and its cache rows repeated. The rows still
    sample apart, every token's log-prob is the teacher-forced one, and greedy rows are those of the distinct prompts
    alone."""
    batch = [prompts[0], prompts[1], prompts[0], prompts[0], prompts[1]]
    prefilled, prefill = [], engine._prefill
    monkeypatch.setattr(engine, "_prefill", lambda ps, room: prefilled.append(len(ps)) or prefill(ps, room))
    out = engine.generate(batch, SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=16, stop=[]), seed=3)
    assert prefilled == [5, 2]  # the batch, then its two distinct prompts
    assert len({tuple(out[k].token_ids) for k in (0, 2, 3)}) > 1
    for g, p in zip(out, batch, strict=True):
        assert g.prompt_ids == p
        assert torch.allclose(torch.tensor(g.logprobs), teacher_forced_logprobs(engine, p, g.token_ids), atol=1e-4)
    greedy = SamplingConfig(greedy=True, max_new_tokens=16, stop=[])
    alone = [g.token_ids for g in engine.generate(prompts[:2], greedy)]
    assert [g.token_ids for g in engine.generate(batch, greedy)] == [alone[0], alone[1], alone[0], alone[0], alone[1]]


def test_rows_run_one_at_a_time_only_when_padding_is_a_large_share():
    from ziprl.policy.engines.hf.engine import UNPADDED_MIN_PADDING, padding_share

    turns = [[0] * n for n in (476, 541, 636, 956, 505, 644, 764, 869)]  # agent turns, a 303-token system prompt
    chat = [[0] * n for n in (46, 39, 42, 44, 42, 41, 44, 39)]  # chat questions, a 24-token template prefix
    assert padding_share(turns, 303) == pytest.approx(1 - 2967 / (8 * 653))
    assert padding_share(turns, 303) > UNPADDED_MIN_PADDING > padding_share(chat, 24)
    assert padding_share([[0] * 5] * 3, 2) == 0.0


def test_rows_are_never_prefilled_alone_for_a_sliding_window_model(engine):
    """Row caches stack into a padded batch only from full-attention layers: the config decides, before any forward."""
    from transformers import MistralConfig, MistralForCausalLM

    tiny = MistralForCausalLM(MistralConfig(vocab_size=len(engine.tokenizer), hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            sliding_window=8))
    assert engine.unpadded_prefill  # the default model on CPU
    assert not HFEngine(model=tiny, tokenizer=engine.tokenizer, unpadded_prefill=True).unpadded_prefill


def test_room_in_the_kv_cache_changes_nothing(engine, prompts, monkeypatch):
    """Decoding appends into reserved room (no cache copy per step): same sampled tokens and log-probs as the
    concatenating cache, with rows leaving the batch on the way (short answers end at EOS before 40 tokens)."""
    from ziprl.policy import kv
    from ziprl.policy.engines.hf import engine as hf_engine

    monkeypatch.setattr(engine, "unpadded_prefill", False)  # the row-by-row prefill builds roomy caches itself
    monkeypatch.setattr(engine, "fused_decode", None)  # both caches through the model's forward (an AVX2 CPU fuses)
    kinds = []
    monkeypatch.setattr(hf_engine, "reserve_room", lambda c, room: kv.reserve_room(c, room) or kinds.append(
        {type(layer) for layer in c.layers}))
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=40, stop=[])
    roomy = engine.generate(prompts, sampling, seed=7)
    assert kinds == [{kv.RoomyLayer}]
    monkeypatch.setattr(hf_engine, "reserve_room", lambda c, room: None)
    plain = engine.generate(prompts, sampling, seed=7)
    assert [g.token_ids for g in roomy] == [g.token_ids for g in plain]
    assert len({len(g.token_ids) for g in roomy}) > 1  # some rows finished early: batch_select_indices ran
    for a, b in zip(roomy, plain, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_sampling_draws_each_token_at_its_probability_and_never_outside_the_nucleus():
    """20,000 draws from known logits: frequencies within 4 sigma of softmax(logits / T); with top-p the tokens
    outside the nucleus and zero-probability tokens never come up; a seeded generator repeats its draws."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05, 0.0]])).repeat(20_000, 1)
    gen = torch.Generator().manual_seed(0)
    draws = sample(logits, SamplingConfig(temperature=1.0, top_p=1.0), False, gen)
    freq = torch.bincount(draws, minlength=5).double() / draws.numel()
    expected = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0], dtype=torch.float64)
    assert torch.all((freq - expected).abs() <= 4 * (expected * (1 - expected) / draws.numel()).sqrt() + 1e-12)
    nucleus = sample(logits, SamplingConfig(temperature=1.0, top_p=0.7), False, gen)
    assert set(nucleus.tolist()) == {0, 1}  # 0.5 + 0.3 reaches 0.7; 0.15, 0.05 and 0 are cut
    share = (nucleus == 0).double().mean().item()
    assert share == pytest.approx(0.5 / 0.8, abs=0.02)  # renormalised over the nucleus
    again = sample(logits[:50], SamplingConfig(), False, torch.Generator().manual_seed(3))
    assert again.equal(sample(logits[:50], SamplingConfig(), False, torch.Generator().manual_seed(3)))
