"""GPU-only checks (run by scripts/gpu_check.sh): HFEngine on CUDA (its static-cache decode steps captured as CUDA
graphs, also on a rollout thread's own stream), a DeepSpeed bf16 ZeRO step, the collective weight push over NCCL
between two processes, and vLLM when installed. A random tiny Llama (and Qwen3) and a tokenizer built here (ziprl/testing/local_model.py): nothing downloaded. Every test
skips with its reason on a machine without CUDA."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing as mp
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from ziprl.testing.local_model import build_tiny_model

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (scripts/gpu_check.sh on a GPU machine); none here")
NO_VLLM = importlib.util.find_spec("vllm") is None


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("gpu-tiny"), hidden=128)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _perturbed(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """A deterministic new version of the weights (the same in every process)."""
    from ziprl.weights.buckets import unique_named_tensors

    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(torch.linspace(-0.01, 0.01, p.numel(), device=p.device).view(p.shape) * (i + 1))
    return unique_named_tensors(model.named_parameters())


def test_hf_engine_generates_on_cuda_with_the_cpu_log_probs(model_dir):
    from ziprl.config import SamplingConfig
    from ziprl.learner.sft import chat_prompt_ids
    from ziprl.policy import HFEngine

    gpu, cpu = HFEngine(model_dir, device="cuda"), HFEngine(model_dir, device="cpu")
    assert gpu.device.type == "cuda"
    prompt = chat_prompt_ids(gpu.tokenizer, [{"role": "user", "content": "who wrote the book"}])
    gen = gpu.generate([prompt, prompt[:5]], SamplingConfig(max_new_tokens=12), seed=0)
    assert all(0 < len(g.token_ids) <= 12 and len(g.logprobs) == len(g.token_ids) for g in gen)
    assert gpu.generation_seconds > gpu.prefill_seconds > 0  # the prefill's span, timed by CUDA events
    ids = torch.tensor([prompt + gen[0].token_ids])
    with torch.no_grad():  # the same tokens scored on CPU: the behaviour log-probs agree
        logits = cpu.model(input_ids=ids).logits[0, len(prompt) - 1: -1].float()
    ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(gen[0].token_ids)[:, None]).squeeze(1)
    np.testing.assert_allclose(gen[0].logprobs, ref.numpy(), atol=2e-3)
    bf16 = HFEngine(model_dir, dtype="bfloat16", device="cuda")
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    assert bf16.generate([prompt], SamplingConfig(max_new_tokens=4), seed=0)[0].token_ids


def test_static_decode_replays_its_graphs_and_keeps_them_through_a_weight_refresh(model_dir):
    """HFEngine on CUDA decodes over its static KV cache by default: in float32 the plain loop's greedy tokens and
    log-probs, with a row ending early (a stop string) and the rest moving to a smaller bucket; each shape captured
    once and replayed after; a weight refresh copied into the weights the graphs read (no new capture, the new
    weights' tokens); sampled log-probs equal to a teacher-forced pass; bf16 runs too."""
    from ziprl.config import SamplingConfig
    from ziprl.learner.sft import chat_prompt_ids
    from ziprl.policy import HFEngine, load_model

    static, plain = HFEngine(model_dir, device="cuda"), HFEngine(model_dir, device="cuda", static_decode=False)
    assert static.static_decode is not None
    assert static.static_decode.capture
    base = chat_prompt_ids(static.tokenizer, [{"role": "user", "content": "who wrote the book"}])
    prompts = [base, base[:5], base + base[:7], base[3:]]
    free = plain.generate(prompts, SamplingConfig(greedy=True, max_new_tokens=40, stop=[]))
    stop = free[0].text[10:13]  # ends row 0 after a few tokens, the others later or at the limit
    assert len(stop) == 3
    greedy = SamplingConfig(greedy=True, max_new_tokens=40, stop=[stop])
    want = plain.generate(prompts, greedy)
    got = static.generate(prompts, greedy)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    assert len(got[0].token_ids) < 40
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-3)
    captured = static.static_decode.captures
    assert captured >= 1
    again = static.generate(prompts, greedy)  # the graphs replayed (the first call ran each shape once eagerly)
    assert static.static_decode.captures == captured  # the same shapes: replayed, not captured again
    assert [g.token_ids for g in again] == [g.token_ids for g in got]
    for a, b in zip(again, got, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    full = SamplingConfig(greedy=True, max_new_tokens=40, stop=[])  # every row to the limit: the same shapes after
    before = static.generate(prompts, full)
    captured, addresses = static.static_decode.captures, [p.data_ptr() for p in static.model.parameters()]
    named = dict(_perturbed(load_model(model_dir, "float32", "cpu")))
    static.load_weights(named, 1)
    plain.load_weights(named, 1)
    assert [p.data_ptr() for p in static.model.parameters()] == addresses
    moved = static.generate(prompts, full)
    assert static.static_decode.captures == captured  # the graphs read the new weights where the old ones were
    assert moved[1].logprobs != before[1].logprobs  # the new weights' distribution
    assert [g.token_ids for g in moved] == [g.token_ids for g in plain.generate(prompts, full)]
    sampled = static.generate(prompts, SamplingConfig(temperature=0.8, top_p=0.9, max_new_tokens=24, stop=[]), seed=0)
    for g, p in zip(sampled, prompts, strict=True):
        with torch.no_grad():
            logits = static.model(input_ids=torch.tensor([p + g.token_ids], device="cuda")).logits[0].float()
        ref = torch.log_softmax(logits[len(p) - 1 : -1], -1).gather(1, torch.tensor(g.token_ids, device="cuda")[:, None])
        np.testing.assert_allclose(g.logprobs, ref.squeeze(1).cpu().numpy(), atol=1e-3)
    bf16 = HFEngine(model_dir, dtype="bfloat16", device="cuda")
    for g in bf16.generate(prompts, SamplingConfig(max_new_tokens=16, stop=[]), seed=0):  # a sampled row may end early
        assert 1 <= len(g.token_ids) <= 16
        assert len(g.token_ids) == 16 or g.token_ids[-1] in bf16.eos_ids, g.finish_reason


def test_a_qwen3_models_static_steps_on_cuda_decode_as_its_own_forward(model_dir, tmp_path):
    """Qwen3's query and key norms, normalised and rotated together in the captured steps, and its attention through
    scaled_dot_product_attention on CUDA: in float32 the plain loop's greedy tokens and log-probs."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ziprl.config import SamplingConfig
    from ziprl.learner.sft import chat_prompt_ids
    from ziprl.policy import HFEngine, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                 tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    static, plain = HFEngine(tmp_path, device="cuda"), HFEngine(tmp_path, device="cuda", static_decode=False)
    assert static.static_decode is not None
    base = chat_prompt_ids(tokenizer, [{"role": "user", "content": "who wrote the book"}])
    prompts = [base, base[:5], base + base[:7]]
    greedy = SamplingConfig(greedy=True, max_new_tokens=24, stop=[])
    want, got = plain.generate(prompts, greedy), static.generate(prompts, greedy)
    assert static.static_decode.captures >= 1
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-3)


def test_the_decode_step_timing_replays_one_graph_and_profiles_its_kernels(monkeypatch):
    """benchmarks/decode_ops.py --time on CUDA at the tiny shape: the timed steps replay the one graph of their span,
    and the profiler sees the step's kernels on the device."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import decode_ops

    row = decode_ops.time_step("tiny", rows=4, span=64, device="cuda")
    assert row["captures"] == 1
    assert row["busy_ms"] > 0 and row["floor_ms"] > 0 and row["step_ms"] > 0
    assert row["top_kernels"] and "aten::" not in row["top_kernels"]  # kernels, not operations


def test_a_rollout_job_on_its_own_stream_beside_the_learners_work_generates_what_it_generates_alone(model_dir):
    """rollout.overlap=thread on CUDA: an HFEngine captures and replays its static-decode graphs on the job's stream,
    on a thread, while the main thread keeps the default stream busy, synchronises the device and draws from the
    default generator (as a learner step may), holding CAPTURE_LOCK as the in-process learner's step does: the same
    greedy tokens and log-probs as an engine alone; after a weight push on the default stream the next job generates
    the new weights' tokens."""
    from ziprl.config import SamplingConfig
    from ziprl.learner.sft import chat_prompt_ids
    from ziprl.policy import HFEngine, load_model
    from ziprl.policy.side_stream import CAPTURE_LOCK, side_stream

    alone, beside = HFEngine(model_dir, device="cuda"), HFEngine(model_dir, device="cuda")
    base = chat_prompt_ids(alone.tokenizer, [{"role": "user", "content": "who wrote the book"}])
    prompts, greedy = [base, base[:5], base[3:]], SamplingConfig(greedy=True, max_new_tokens=40, stop=[])
    stream = side_stream(beside.weights_device)

    def job_beside_learner_work() -> list:
        got: list = []

        def job() -> None:
            with stream():
                got.extend(beside.generate(prompts, greedy))

        thread, a = threading.Thread(target=job), torch.randn(1024, 1024, device="cuda")
        thread.start()
        while thread.is_alive():
            with CAPTURE_LOCK:
                a = torch.tanh(a @ a + torch.randn_like(a))
                torch.cuda.synchronize()
        thread.join()
        return got

    for version in (0, 1):
        if version:
            named = dict(_perturbed(load_model(model_dir, "float32", "cpu")))
            alone.load_weights(named, version)
            beside.load_weights(named, version)
        want, got = alone.generate(prompts, greedy), job_beside_learner_work()
        assert [g.token_ids for g in got] == [g.token_ids for g in want]
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-3)
    assert beside.static_decode.captures >= 1


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_bf16_zero_step(stage, model_dir):
    from ziprl.learner.trainer import Trainer
    from ziprl.testing.learner import make_cfg, make_groups

    trainer = Trainer(make_cfg(bf16=True, zero_stage=stage, lr=1e-3, beta=0.001), model_dir)
    assert trainer.device.type == "cuda"
    groups = make_groups(model_dir, groups=2, group_size=2, max_turns=2)
    first, second = trainer.train_step(groups), trainer.train_step(groups)
    assert np.isfinite(first["loss"])
    assert np.isfinite(first["grad_norm"])
    assert second["loss"] < first["loss"]
    with trainer.gathered():
        assert {p.dtype for p in trainer.engine.module.parameters()} == {torch.bfloat16}
    assert all(np.isfinite(a).all() for a in trainer.named_weights_numpy().values())


def test_a_checkpoint_written_while_the_next_step_trains_holds_the_weights_of_when_it_was_taken(model_dir, tmp_path):
    """The GPU learner's background checkpoint (on by default there: ``run.background_checkpoints``): the snapshot is
    copied off the GPU, the write runs in a thread while the next bf16 ZeRO-2 step changes the weights, and loading
    it gives back the weights (and Adam's step) of when it was taken."""
    from ziprl.learner import checkpoint
    from ziprl.learner.trainer import Trainer
    from ziprl.testing.learner import make_cfg, make_groups

    trainer = Trainer(make_cfg(bf16=True, zero_stage=2, lr=1e-3, beta=0.001), model_dir)
    groups = make_groups(model_dir, groups=2, group_size=2, max_turns=2)
    trainer.train_step(groups)
    taken = trainer.named_weights_numpy()
    snap = checkpoint.snapshot(trainer, tmp_path, {"index": 1})
    assert all(t.device.type == "cpu" for f in snap.files.values() for t in f.values())
    release, written = threading.Event(), []
    writer = threading.Thread(target=lambda: (release.wait(60), written.append(checkpoint.write_snapshot(snap))))
    writer.start()
    trainer.train_step(groups)  # the next step, while the write is held back
    torch.cuda.synchronize()
    moved = trainer.named_weights_numpy()
    release.set()
    writer.join(120)
    assert written == [snap.path]
    assert checkpoint.latest_checkpoint(tmp_path) == snap.path
    assert any(not np.array_equal(moved[k], taken[k]) for k in taken)  # the step changed the weights ...
    assert checkpoint.load_checkpoint(trainer, snap.path) == {"index": 1}
    loaded = trainer.named_weights_numpy()
    assert all(np.array_equal(loaded[k], taken[k]) for k in taken)  # ... and the checkpoint holds the ones before it
    assert trainer.global_step == 1


def _nccl_member(rank: int, port: int, model_dir: str, out: str) -> None:
    """One process of the NCCL push: rank 0 sends bf16 buckets of the perturbed model, rank 1 receives into
    a bf16 HFEngine on CUDA and checks the bits. Writes {"ok": ...} or {"error": ...} to ``out``."""
    from ziprl.policy import HFEngine, load_model
    from ziprl.weights.buckets import iter_packed, plan_for
    from ziprl.weights.collective import Group

    try:
        dev = torch.device("cuda", rank)
        torch.cuda.set_device(dev)
        named = _perturbed(load_model(model_dir, "float32", str(dev)))
        plan = plan_for(named, "bfloat16", 1 << 16)  # several buckets
        if rank == 0:
            sender = Group("127.0.0.1", port, rank, 2, 120, "127.0.0.1", dev)
            sent = sender.send(7, len(plan), iter_packed(named, plan, lambda ps: torch.no_grad(), dev))
            result = {"ok": True, "bytes": sent}
        else:
            engine = HFEngine(model_dir, dtype="bfloat16", device=str(dev))
            engine.join_weights("127.0.0.1", port, rank, 2, 120, "127.0.0.1")  # its group end on its GPU: NCCL
            version = engine.receive_weights([], 0)
            state = engine.model.state_dict()
            same = all(torch.equal(state[n].view(torch.int16), t.detach().bfloat16().view(torch.int16))
                       for n, t in named)
            result = {"ok": bool(same and version == 7 and engine.version == 7), "version": version}
        torch.cuda.synchronize()
    except Exception as exc:  # reported to the parent, which fails or skips with it
        result = {"error": f"{type(exc).__name__}: {exc}"}
    Path(out).write_text(json.dumps(result))


@pytest.mark.skipif(CUDA and torch.cuda.device_count() < 2,
                    reason="NCCL puts one rank per GPU (two ranks on one GPU: 'Duplicate GPU detected'); needs 2 GPUs")
def test_collective_push_over_nccl_between_two_processes(model_dir, tmp_path):
    ctx, port = mp.get_context("spawn"), _port()
    outs = [tmp_path / f"rank{r}.json" for r in (0, 1)]
    procs = [ctx.Process(target=_nccl_member, args=(r, port, str(model_dir), str(outs[r]))) for r in (0, 1)]
    [p.start() for p in procs]
    [p.join(300) for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    results = [json.loads(o.read_text()) if o.exists() else {"error": "no result (killed or crashed)"} for o in outs]
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors
    assert all(r["ok"] for r in results), results


@pytest.mark.skipif(NO_VLLM, reason="vLLM is not installed (pip install 'ziprl[gpu]')")
def test_vllm_engine_generates_and_loads_weights(model_dir):
    from ziprl.config import SamplingConfig
    from ziprl.policy import VLLMEngine, load_model

    engine = VLLMEngine(model_dir, dtype="bfloat16", gpu_memory_utilization=0.3, enforce_eager=True)
    prompt = engine.tokenizer("who wrote the book")["input_ids"]
    greedy = SamplingConfig(greedy=True, max_new_tokens=8, stop=[])
    before = engine.generate([prompt], greedy, seed=0)[0]
    named = dict(_perturbed(load_model(model_dir, "float32", "cpu")))
    engine.load_weights({n: t.bfloat16() for n, t in named.items()}, 3)
    after = engine.generate([prompt], greedy, seed=0)[0]
    assert engine.version == 3
    assert before.token_ids
    assert after.token_ids
    assert before.logprobs != after.logprobs  # new weights, new distribution


@pytest.mark.skipif(NO_VLLM or (CUDA and torch.cuda.device_count() < 2),
                    reason="vLLM's NCCL weight transfer needs vLLM and 2 GPUs (NCCL: one rank per GPU)")
def test_vllm_weight_transfer_over_nccl(model_dir):
    """The learner's end (vLLM's trainer_init + one broadcast per tensor) to a VLLMEngine on the other GPU."""
    from vllm.distributed.weight_transfer.nccl_common import trainer_init

    from ziprl.policy import VLLMEngine, load_model
    from ziprl.weights.buckets import plan_for

    engine = VLLMEngine(model_dir, dtype="bfloat16", gpu_memory_utilization=0.3, enforce_eager=True)
    torch.cuda.set_device(1)  # the learner's end on the GPU vLLM does not use
    port = _port()
    joined = threading.Thread(target=engine.join_weights, args=("127.0.0.1", port, 1, 2, 120, "127.0.0.1"))
    joined.start()
    comm = trainer_init({"master_address": "127.0.0.1", "master_port": port, "world_size": 2})
    joined.join()
    named = _perturbed(load_model(model_dir, "float32", "cuda:1"))
    metas = [(m.name, m.dtype, list(m.shape)) for b in plan_for(named, "bfloat16", 1 << 20) for m in b]
    recv = threading.Thread(target=engine.receive_weights, args=(metas, 5))
    recv.start()
    tensors = dict(named)
    for name, _, _ in metas:
        comm.broadcast(tensors[name].detach().bfloat16().contiguous(), src=0, stream=torch.cuda.current_stream())
    recv.join(120)
    assert engine.version == 5
