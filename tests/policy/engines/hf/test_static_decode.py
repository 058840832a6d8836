"""HFEngine's static-cache decode loop (ziprl/policy/engines/hf/static_decode.py) run on a CPU, where it runs
without CUDA graphs: the same greedy tokens and log-probs as the plain loop, behaviour log-probs equal to a teacher-forced pass,
rows leaving the batch in buckets, buffers that grow, and weight refreshes that write in place. The CUDA graphs
themselves are tested in tests/test_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import REPO
from ziprl.config import ConfigError, ModelConfig, SamplingConfig
from ziprl.policy import HFEngine, make_engine, resolve_model_path
from ziprl.policy.decoding import draw, sample
from ziprl.policy.engines.hf.static_decode import POSITION_CHUNK, StaticDecode, bucket, round_up

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# the tiny random model's greedy text switches words at different steps: these stops end rows at 4, 5, 8, 9 and 9
# tokens, two rows run to the limit
TEXTS = ["hello there my friend", "a", "the quick brown fox jumps", "x y", "one two three", "<search>apple</search>",
         "Paris is"]
STOPS = ["manu", "Wien", "dra", " Reserve Reserve Reserve", "Hitler Hitler Hitler Hitler Hitler"]


@pytest.fixture(scope="module")
def plain(tiny_model_dir) -> HFEngine:
    return HFEngine(tiny_model_dir, device="cpu")


@pytest.fixture(scope="module")
def static(tiny_model_dir) -> HFEngine:
    return HFEngine(tiny_model_dir, device="cpu", static_decode=True)


@pytest.fixture(scope="module")
def prompts(plain) -> list[list[int]]:
    return [plain.tokenizer(t)["input_ids"] for t in TEXTS]


def teacher_forced(engine: HFEngine, prompt: list[int], response: list[int]) -> list[float]:
    """log pi(token) at temperature 1 from one unpadded forward over prompt + response."""
    with torch.inference_mode():
        logits = engine.model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1).tolist()


def assert_same(got, want, atol: float = 1e-5) -> None:
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    assert [g.finish_reason for g in got] == [g.finish_reason for g in want]
    assert [g.text for g in got] == [g.text for g in want]
    for a, b in zip(got, want, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=atol)


def test_it_is_off_on_a_cpu_by_default_and_on_where_asked(plain, static, tiny_model_dir):
    assert plain.static_decode is None
    assert "cpu" in plain.static_decode_off
    assert isinstance(static.static_decode, StaticDecode)
    assert static.static_decode_off is None
    assert not static.static_decode.capture  # no CUDA graphs on a CPU
    assert HFEngine(tiny_model_dir, device="cpu", static_decode=False).static_decode_off == "static_decode=false"
    given = HFEngine(model=plain.model, tokenizer=plain.tokenizer)
    assert given.static_decode is None
    assert given.static_decode_off == "given a loaded model"
    assert ModelConfig().static_decode is None
    assert make_engine(ModelConfig(device="cpu", static_decode=True), tiny_model_dir).static_decode is not None


def test_a_model_it_cannot_run_is_refused_when_asked_for_and_skipped_otherwise(plain):
    from transformers import GPT2Config, GPT2LMHeadModel, MistralConfig, MistralForCausalLM

    from ziprl.policy.engines.hf.static_decode import static_decode

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2))
    window = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                              num_attention_heads=4, num_key_value_heads=2, sliding_window=8))
    for model, why in [(gpt2, "model_type 'gpt2'"), (window, "sliding-window")]:
        with pytest.raises(ConfigError, match=rf"^model.static_decode=true: {why}.*set model.static_decode=null"):
            static_decode(model, True, 0)
        assert static_decode(model, None, 0) == (None, "the model is on cpu (null: on CUDA only)")
    assert static_decode(window, False, 0) == (None, "static_decode=false")


def test_a_qwen3_model_whose_query_and_key_norms_differ_is_not_run():
    """The step normalises the query and key heads together, with one epsilon."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ziprl.policy.engines.hf.static_decode import unsupported

    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=8))
    assert unsupported(model) is None
    model.model.layers[1].self_attn.k_norm.variance_epsilon = 1e-3
    assert unsupported(model) == ("query and key norms of different epsilons are not supported (they are normalised "
                                  "together)")


@pytest.mark.parametrize("sync_every", [1, 4, 16])
def test_greedy_tokens_and_log_probs_equal_the_plain_loops(plain, static, prompts, monkeypatch, sync_every):
    """Rows end at different steps (stop strings) and the 7 rows run in 8 slots: finished rows are recorded no
    further, and the running ones move into smaller buckets (4 rows of 8 left: 4 slots, and so on)."""
    monkeypatch.setattr(static.static_decode, "sync_every", sync_every)
    monkeypatch.setattr(static.static_decode, "buffers", None)  # allocated anew with this many draws per read
    buckets = []
    compact = StaticDecode._compact
    monkeypatch.setattr(StaticDecode, "_compact", lambda self, live, cols: buckets.append(compact(self, live, cols))
                        or buckets[-1])
    sampling = SamplingConfig(greedy=True, max_new_tokens=40, stop=STOPS)
    want = plain.generate(prompts, sampling)
    assert sorted(len(g.token_ids) for g in want) == [4, 5, 8, 9, 9, 40, 40]
    assert_same(static.generate(prompts, sampling), want)
    assert buckets
    assert buckets[-1] == 2
    assert buckets == sorted(buckets, reverse=True)
    odd = SamplingConfig(greedy=True, max_new_tokens=sync_every + 3, stop=[])  # a last window cut short
    assert_same(static.generate(prompts[:3], odd), plain.generate(prompts[:3], odd))


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sampled_behaviour_log_probs_are_the_teacher_forced_ones(static, prompts, top_p):
    sampling = SamplingConfig(temperature=0.8, top_p=top_p, max_new_tokens=24, stop=[])
    out = static.generate(prompts, sampling, seed=1)
    assert out == static.generate(prompts, sampling, seed=1)  # seeded: the same draws
    assert [g.token_ids for g in out] != [g.token_ids for g in static.generate(prompts, sampling, seed=2)]
    for g, p in zip(out, prompts, strict=True):
        assert len(g.token_ids) == len(g.logprobs) == 24
        assert g.finish_reason == "length"
        assert g.logprobs == pytest.approx(teacher_forced(static, p, g.token_ids), abs=1e-4)


def test_the_buffers_grow_for_more_rows_or_positions_and_are_kept_otherwise(tiny_model_dir, plain, prompts):
    engine = HFEngine(tiny_model_dir, device="cpu", static_decode=True)
    sampling = SamplingConfig(greedy=True, max_new_tokens=12, stop=[])
    engine.generate(prompts[:2], sampling)
    first = engine.static_decode.buffers
    assert tuple(first.bias.shape) == (2, round_up(max(map(len, prompts[:2])) + 12, POSITION_CHUNK))
    engine.generate(prompts[1:2], sampling)
    assert engine.static_decode.buffers is first  # fewer rows: the same buffers
    longer = [prompts[0] * (300 // len(prompts[0]) + 1)]  # more positions than the first buffers hold
    assert_same(engine.generate(longer + prompts, sampling), plain.generate(longer + prompts, sampling))
    grown = engine.static_decode.buffers
    assert tuple(grown.bias.shape) == (8, round_up(len(longer[0]) + 12, POSITION_CHUNK))


def test_a_weight_refresh_writes_into_the_weights_the_steps_read(static, plain, prompts):
    """With static decode the parameters keep their memory (CUDA graphs replay on its addresses): new values are
    copied in, from arrays of any dtype, read-only ones included, and reach the fused projections the steps read (a
    key and an up projection change); the buffers stay as they are."""
    sampling = SamplingConfig(greedy=True, max_new_tokens=8, stop=[])
    original = {k: v.detach().numpy().copy() for k, v in static.model.state_dict().items()}
    base = static.generate(prompts, sampling)
    addresses = {k: v.data_ptr() for k, v in static.model.state_dict().items()}
    buffers = static.static_decode.buffers
    try:
        changed = {k: v.astype(np.float64) for k, v in original.items()}
        changed["model.norm.weight"] = -changed["model.norm.weight"]
        for name in ("model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.up_proj.weight"):
            changed[name] = changed[name] * 3.0
        for v in changed.values():
            v.flags.writeable = False  # as ray.get returns object-store arrays
        static.load_weights(changed, version=1)
        assert {k: v.data_ptr() for k, v in static.model.state_dict().items()} == addresses
        assert static.version == 1
        assert static.static_decode.buffers is buffers
        assert torch.equal(static.model.model.norm.weight, torch.from_numpy(-original["model.norm.weight"]))
        plain.load_weights(changed, version=1)
        moved = static.generate(prompts, sampling)
        assert [g.token_ids for g in moved] != [g.token_ids for g in base]
        assert_same(moved, plain.generate(prompts, sampling))
    finally:
        static.load_weights(original, version=0)
        plain.load_weights(original, version=0)
    assert_same(static.generate(prompts, sampling), base, atol=0)


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_a_qwen_model_decodes_as_its_own_forward(plain, prompts, tmp_path, family):
    """Qwen3's per-head query and key norms and Qwen2's query, key and value biases (fused into one), with untied
    heads, through the same steps."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config_class, model_class = (Qwen3Config, Qwen3ForCausalLM) if family == "qwen3" else (Qwen2Config,
                                                                                           Qwen2ForCausalLM)
    config = config_class(vocab_size=len(plain.tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
                          eos_token_id=plain.tokenizer.eos_token_id, pad_token_id=plain.tokenizer.pad_token_id)
    model = model_class(config)
    if family == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None
        for name, param in model.named_parameters():
            if name.endswith("proj.bias"):  # random biases, not HF's zeros, so the fused bias matters
                torch.nn.init.normal_(param, std=0.5)
    model.save_pretrained(tmp_path)
    plain.tokenizer.save_pretrained(tmp_path)
    sampling = SamplingConfig(greedy=True, max_new_tokens=20, stop=[])
    qwen_plain, qwen_static = HFEngine(tmp_path, device="cpu"), HFEngine(tmp_path, device="cpu", static_decode=True)
    assert qwen_static.static_decode is not None
    assert_same(qwen_static.generate(prompts, sampling), qwen_plain.generate(prompts, sampling))


@pytest.mark.slow
def test_the_default_model_generates_as_the_plain_loop():
    """SmolLM2-135M in float32: answers that end at EOS at different steps, the same tokens and log-probs as the
    plain loop, and sampled log-probs equal to a teacher-forced pass."""
    path = resolve_model_path(ModelConfig())
    plain, static = HFEngine(path, device="cpu"), HFEngine(path, device="cpu", static_decode=True)
    questions = ["What is the capital of France?", "Write a long poem about the sea, the sky and the wind.", "Hi"]
    prompts = [plain.encode_chat([{"role": "user", "content": q}]) for q in questions]
    greedy = SamplingConfig(greedy=True, max_new_tokens=40, stop=[])
    want = plain.generate(prompts, greedy)
    assert len({len(g.token_ids) for g in want}) == 3
    assert want[0].finish_reason == "stop"
    assert_same(static.generate(prompts, greedy), want, atol=1e-4)
    sampled = static.generate(prompts, SamplingConfig(temperature=0.8, top_p=0.95, max_new_tokens=24, stop=[]), seed=1)
    for g, p in zip(sampled, prompts, strict=True):
        assert g.logprobs == pytest.approx(teacher_forced(static, p, g.token_ids), abs=1e-4)


def test_draw_is_the_samplers_inverse_cdf_with_tensor_settings():
    """The sampler's draw with the temperature and top-p as tensors (as the captured steps hold them) and the
    uniform numbers given: the same tokens as ``sample`` from the same generator."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    for top_p in (1.0, 0.8):
        sampling = SamplingConfig(temperature=0.7, top_p=top_p)
        want = sample(logits, sampling, False, torch.Generator().manual_seed(4))
        u = 1.0 - torch.rand((6, 1), generator=torch.Generator().manual_seed(4))
        got = draw(logits, torch.tensor([0.7]), torch.tensor([top_p]) if top_p < 1 else None, u)
        assert got.tolist() == want.tolist()


def test_buckets_are_powers_of_two():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 64, 65)] == [1, 2, 4, 4, 8, 8, 16, 64, 128]
    assert [round_up(n, 256) for n in (1, 256, 257)] == [256, 256, 512]


def test_the_throughput_benchmark_runs_a_tiny_shape_on_a_cpu(tmp_path, monkeypatch, capsys):
    """benchmarks/engine_throughput.py --arch: static decode against the plain loop at a shape, with the
    memory-bound ceiling beside it; a CPU smoke run at the tiny shape."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import engine_throughput

    row = engine_throughput.measure_shape("tiny", rows=3, prompt_tokens=40, new_tokens=6, repeats=1, device="cpu",
                                          workdir=tmp_path)
    assert (row["arch"], row["rows"], row["device"], row["dtype"]) == ("tiny", 3, "cpu", "float32")
    assert row["static_tok_s"] > 0
    assert row["plain_tok_s"] > 0
    assert row["static_prefill_s"] > 0
    assert row["static_decode_tok_s"] > row["static_tok_s"]  # the same tokens over the call less its prefill
    assert row["same_tokens"] == 1.0  # float32: the greedy rows agree
    assert row["captures"] == 0  # no graphs on a CPU
    per_layer = 64 * 64 * 2 + 64 * 32 * 2 + 64 * 128 * 3 + 64 * 2  # q, o; k, v (2 kv heads x 16); the MLP; 2 norms
    assert row["weight_bytes"] == 4 * (49152 * 64 + 2 * per_layer + 64)  # float32; the head tied to the embeddings
    assert row["ceiling_tok_s"] == pytest.approx(3 * row["bandwidth_gb_s"] * 1e9 / row["weight_bytes"])
    assert row["ceiling_tok_s"] > row["ceiling_with_kv_tok_s"] > 0
    assert "memory-bound ceiling" in capsys.readouterr().out


def test_the_steps_norm_and_rope_are_transformers_own_bit_for_bit_in_bfloat16():
    """``rms`` equals the model's RMS norm module and ``rotate`` transformers' ``x * cos + rotate_half(x) * sin``
    exactly in bfloat16 (the rounding a GPU rollout runs in), on a strided view as the fused projection gives."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, rotate_half

    from ziprl.policy.engines.hf.static_decode import rms, rotate, signed_sine

    gen = torch.Generator().manual_seed(0)
    norm = Qwen3RMSNorm(128, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(128, generator=gen))
    fused = (3 * torch.randn(16, 1, 6 * 128, generator=gen)).to(torch.bfloat16)
    x = fused[..., : 4 * 128].view(16, 1, 4, 128)  # a query's heads, as split from q/k/v's one output
    assert not x.is_contiguous()
    assert torch.equal(rms(norm, x), norm(x))
    angles = torch.randn(16, 1, 1, 128, generator=gen)
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    assert torch.equal(rotate(x, cos, signed_sine(sin)), x * cos + rotate_half(x) * sin)


def test_fused_linears_compute_what_the_layers_did_and_stay_their_weights():
    from ziprl.policy.engines.hf.static_decode import fuse_linears

    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, n) for n in (4, 2, 2)]
    x = torch.randn(3, 8)
    want = [layer(x) for layer in layers]
    weight, bias, sizes = fuse_linears(layers)
    assert (tuple(weight.shape), tuple(bias.shape), sizes) == ((8, 8), (8,), [4, 2, 2])
    got = torch.nn.functional.linear(x, weight, bias).split(sizes, -1)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert all(torch.equal(layer(x), w) for layer, w in zip(layers, want, strict=True))  # the layers unchanged
    with torch.no_grad():
        layers[1].weight.copy_(torch.ones(2, 8))  # as a weight refresh writes
    assert torch.equal(weight[4:6], torch.ones(2, 8))
    assert all(layer.weight.is_contiguous() for layer in layers)
    assert fuse_linears([torch.nn.Linear(8, 4, bias=False), torch.nn.Linear(8, 4, bias=False)])[1] is None
    with pytest.raises(ValueError, match="some of the layers have a bias and some do not"):
        fuse_linears([torch.nn.Linear(8, 4), torch.nn.Linear(8, 4, bias=False)])


def test_the_op_count_benchmark_counts_a_static_step_and_a_transformers_one(monkeypatch):
    """benchmarks/decode_ops.py at the tiny Llama shape: the static step's layer is its 19 operations (four matrix
    products: q/k/v fused, o, gate/up fused, down; two fused norms; the query and key heads rotated together; one
    attention call), against the transformers decode forward's own count."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import decode_ops

    # DeepSpeed's ZeRO-3 replaces F.linear for the rest of a process ("This will persist unless manually reset"), so a
    # ZeRO-3 test earlier in this worker would have the matrix products counted as its wrapper's matmul
    monkeypatch.setattr(torch.nn.functional, "linear", torch._C._nn.linear)

    static, plain = decode_ops.measure("tiny", rows=3, span=20, device="cpu")
    assert (static["loop"], plain["loop"], static["layers"]) == ("static", "plain", 2)
    assert static["ops_per_layer"] == 19
    assert static["layer_ops"] == ("mul.Tensor x5, linear.default x4, add.Tensor x3, rms_norm.default x2, "
                                   "index_copy_.default x2, roll.default x1, scaled_dot_product_attention.default x1, "
                                   "silu.default x1")
    assert plain["ops_per_layer"] > static["ops_per_layer"]
    assert "linear.default x7" in plain["layer_ops"]  # q, k, v, o, gate, up, down
    assert static["ops_per_step"] < plain["ops_per_step"]


def test_the_op_count_benchmark_times_a_step_against_its_memory_bound_floor(monkeypatch):
    """decode_ops --time at the tiny shape on a CPU: the engine's decode loop runs its steps eagerly (no graph) at one
    span, rounded up to the position chunk with room for the timed steps; the floor is the weights and the attended
    KV cache read once, and the profile names the operations the step spends its time in."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import decode_ops

    row = decode_ops.time_step("tiny", rows=3, span=20, device="cpu")
    assert (row["loop"], row["span"], row["layers"], row["captures"]) == ("static", POSITION_CHUNK, 2, 0)
    config = decode_ops.arch_config("tiny")
    kv = 3 * POSITION_CHUNK * 2 * 2 * config.num_key_value_heads * config.head_dim * 2  # rows, span, layers, k+v, bf16
    assert row["kv_gb"] == pytest.approx(kv / 1e9)
    assert row["weight_gb"] > 2 * config.vocab_size * config.hidden_size / 1e9  # the tied embedding at least
    assert row["floor_ms"] > 0 and row["step_ms"] > 0 and row["busy_ms"] > 0
    assert row["step_over_floor"] == pytest.approx(row["step_ms"] / row["floor_ms"])
    assert row["tok_s"] == pytest.approx(3e3 / row["step_ms"])
    assert "aten::mm" in row["top_kernels"]


@pytest.mark.parametrize("argv", [["--rows", "0"], ["--span", "-1"], ["--arch", "nope"]]
                         + ([] if torch.cuda.is_available() else [["--device", "cuda"]]))
def test_the_op_count_benchmark_refuses_bad_input_with_exit_2(monkeypatch, argv):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import decode_ops

    monkeypatch.setattr("sys.argv", ["decode_ops.py", *argv, "--name", "never_written"])
    try:
        code = decode_ops.main()
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert not (REPO / "benchmarks" / "results" / "never_written.json").exists()
