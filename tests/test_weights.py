"""The weight wire format (16-bit payloads, buckets, headers, tied weights), the gloo group with the engine's
between-batches rule, and both transports end to end through the contract (threads of this process, no Ray)."""

from __future__ import annotations

import dataclasses
import socket
import threading
import types

import pytest
import torch

from ziprl.policy import HFEngine
from ziprl.registry import TRANSPORTS
from ziprl.weights import LearnerWeights, WeightReceiver
from ziprl.weights.buckets import (
    ALIGN,
    Bucket,
    buffer_size,
    iter_packed,
    plan_buckets,
    plan_for,
    unique_named_tensors,
    unpack,
    wire_dtype,
)
from ziprl.weights.collective import Group


def _named(dtype: torch.dtype = torch.float32) -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Embedding(11, 6), torch.nn.Linear(6, 5), torch.nn.LayerNorm(5))
    return list(m.to(dtype).named_parameters())


def _send_receive(named, engine_dtype: str, bucket_bytes: int, numpy: bool = False) -> dict[str, torch.Tensor]:
    plan = plan_for(named, engine_dtype, bucket_bytes)
    out = {}
    for metas, buf in iter_packed(named, plan, lambda ps: torch.no_grad()):
        out.update(unpack(metas, buf.numpy() if numpy else buf))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bucket_bytes", [1, 200, 1 << 20])
def test_round_trip_is_bit_exact_in_the_tensors_own_dtype(dtype, bucket_bytes):
    named = _named(dtype)
    got = _send_receive(named, str(dtype).removeprefix("torch."), bucket_bytes, numpy=bucket_bytes == 200)
    assert list(got) == [n for n, _ in named]
    for name, t in named:
        assert got[name].dtype == dtype
        assert got[name].shape == t.shape
        # bit-exact: compare the raw bits, not the values (NaN-safe, -0.0 distinct)
        bits = torch.int16 if dtype != torch.float32 else torch.int32
        assert torch.equal(got[name].view(bits), t.detach().view(bits)), name


def test_float32_master_weights_travel_as_the_16_bit_engine_dtype_at_half_the_bytes():
    named = _named(torch.float32)
    for engine in ("bfloat16", "float16"):
        got = _send_receive(named, engine, 1 << 20)
        for name, t in named:  # the same rounding the engine's own cast would do on arrival
            assert torch.equal(got[name].view(torch.int16), t.detach().to(getattr(torch, engine)).view(torch.int16))
    wide = sum(m.nbytes for b in plan_for(named, "float32", 1 << 20) for m in b)
    narrow = sum(m.nbytes for b in plan_for(named, "bfloat16", 1 << 20) for m in b)
    assert wide == sum(t.numel() * 4 for _, t in named)
    assert narrow * 2 == wide
    assert wire_dtype(torch.bfloat16, "float32") == torch.bfloat16  # a bf16 learner never widens
    assert wire_dtype(torch.int64, "bfloat16") == torch.int64


def test_plan_buckets_respects_the_size_and_alignment():
    specs = [("a", "bfloat16", (10,), 2), ("b", "float32", (3, 3), 4), ("c", "bfloat16", (1000,), 2), ("d", "float32", (1,), 4)]
    plan = plan_buckets(specs, bucket_bytes=128)
    assert [[m.name for m in b] for b in plan] == [["a", "b"], ["c"], ["d"]]  # c alone: larger than a bucket
    assert [m.offset for m in plan[0]] == [0, ALIGN]
    assert all(m.offset % ALIGN == 0 for b in plan for m in b)
    assert plan[1][0].nbytes == 2000
    assert len(plan_buckets(specs, 1 << 30)) == 1
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(specs, 0)


def test_tied_weights_are_sent_once():
    emb, head = torch.nn.Embedding(7, 4), torch.nn.Linear(4, 7, bias=False)
    head.weight = emb.weight
    named = unique_named_tensors([("emb.weight", emb.weight), ("head.weight", head.weight)])
    assert [n for n, _ in named] == ["emb.weight"]


def test_header_round_trip_and_bad_buffers():
    plan = plan_for(_named(), "bfloat16", 1 << 20)
    b = Bucket(7, 0, 1, plan[0])
    again = Bucket.from_header(b.header())
    assert again == b
    assert again.version == 7
    assert again.nbytes == b.nbytes
    with pytest.raises(ValueError, match="flat uint8"):
        unpack(plan[0], torch.zeros(4, dtype=torch.uint8))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _together(*calls):
    """Run the calls in threads at once (the two ends of a rendezvous or a broadcast); their results in order."""
    out = [None] * len(calls)
    threads = [threading.Thread(target=lambda i=i, c=c: out.__setitem__(i, c())) for i, c in enumerate(calls)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    return out


def _perturbed(tiny_model_dir, delta: float = 0.01) -> list[tuple[str, torch.Tensor]]:
    src = HFEngine(tiny_model_dir, dtype="float32", device="cpu").model
    with torch.no_grad():
        for p in src.parameters():
            p.add_(delta)
    return unique_named_tensors(src.named_parameters())


def _assert_holds(engine, named) -> None:
    for name, p in named:
        assert torch.equal(engine.model.state_dict()[name].view(torch.int16), p.detach().bfloat16().view(torch.int16))


def test_gloo_push_waits_for_the_batch_then_applies_and_ignores_older_versions(tiny_model_dir):
    """An engine busy generating (holding its weights) keeps the push pending; it is installed before the next batch."""
    engine = HFEngine(tiny_model_dir, dtype="bfloat16", device="cpu")
    named = _perturbed(tiny_model_dir)
    plan = plan_for(named, "bfloat16", 64 << 10)
    port = _port()
    sender, _ = _together(lambda: Group("127.0.0.1", port, 0, 2, 60, "127.0.0.1"),
                          lambda: engine.join_weights("127.0.0.1", port, 1, 2, 60, "127.0.0.1"))

    def push(version: int) -> None:
        sender.send(version, len(plan), iter_packed(named, plan, lambda ps: torch.no_grad()))

    with engine.holding_weights():  # a batch is generating
        _, received = _together(lambda: push(3), lambda: engine.receive_weights([], 0))
        assert received == 3
        assert engine.version == 0  # pending, not applied mid-batch
    with engine.holding_weights():  # the next batch installs it first
        assert engine.version == 3
    _assert_holds(engine, named)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    with torch.no_grad():
        for _, p in named:
            p.add_(1.0)
    _, received = _together(lambda: push(2), lambda: engine.receive_weights([], 0))  # older: received, ignored
    assert received == 2
    assert engine.version == 3
    assert all(torch.equal(before[k], v) for k, v in engine.model.state_dict().items())
    engine.leave_weights()
    with pytest.raises(RuntimeError, match="no member of the weight group"):
        engine.receive_weights([], 4)


def _learner_weights(named, receiver: type[WeightReceiver] = WeightReceiver) -> LearnerWeights:
    return LearnerWeights(named, lambda ps: torch.no_grad(), "cpu", 0, False, "bfloat16", receiver)


def test_the_collective_transport_announces_the_plan_and_broadcasts_into_an_idle_engine(tiny_model_dir):
    engine = HFEngine(tiny_model_dir, dtype="bfloat16", device="cpu")
    named = _perturbed(tiny_model_dir)
    weights, transport = _learner_weights(named), TRANSPORTS["collective"](0.05)  # several buckets
    port = _port()
    end, _ = _together(lambda: transport.join(weights, "127.0.0.1", port, 2, 60, "127.0.0.1"),
                       lambda: engine.join_weights("127.0.0.1", port, 1, 2, 60, "127.0.0.1"))
    plan = transport.announce(weights, 5, None)
    assert plan.version == 5
    assert [m[0] for m in plan.metas] == [n for n, _ in named]
    assert plan.nbytes == sum(buffer_size(b) for b in weights.plan(transport.bucket_bytes))
    assert len(weights.plan(transport.bucket_bytes)) > 1
    _, got = _together(lambda: transport.send(weights, 5, end), lambda: transport.receive(engine, plan, None))
    assert got == 5
    assert engine.version == 5  # idle: installed at once
    _assert_holds(engine, named)


def test_the_object_store_transport_puts_each_bucket_once_and_loads_only_newer_versions(tiny_model_dir):
    engine = HFEngine(tiny_model_dir, dtype="bfloat16", device="cpu")
    named = _perturbed(tiny_model_dir)
    objects: list = []
    store = types.SimpleNamespace(put=lambda obj: objects.append(obj) or len(objects) - 1,
                                  get=lambda refs: [objects[r] for r in refs])
    weights, transport = _learner_weights(named), TRANSPORTS["object_store"](0.05)
    stored = transport.announce(weights, 2, store)
    assert stored.version == 2
    assert len(stored.buckets) == len(objects) > 1
    assert stored.nbytes == sum(b.data.nbytes for b in objects)
    assert transport.receive(engine, stored, store) == 2
    _assert_holds(engine, named)
    older = transport.announce(_learner_weights(_perturbed(tiny_model_dir, 1.0)), 1, store)
    assert transport.receive(engine, older, store) == 2  # an older version: not loaded
    _assert_holds(engine, named)
    assert transport.announce(dataclasses.replace(weights, rank=1), 3, store) is None  # only rank 0 puts


def test_the_transports_are_registered_under_their_config_values():
    assert TRANSPORTS.names() == ("object_store", "collective")
    assert not TRANSPORTS["object_store"].grouped
    assert TRANSPORTS["collective"].grouped
