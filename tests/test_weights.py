"""The weight wire format (16-bit payloads, buckets, headers, tied weights), the staleness rule, and the
gloo group with the receiver's between-batches rule (two threads of this process, no Ray)."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest
import torch

from ziprl.actors.weight_buckets import (
    ALIGN,
    Bucket,
    iter_packed,
    plan_buckets,
    plan_for,
    unique_named_tensors,
    unpack,
    wire_dtype,
)
from ziprl.actors.weight_sync import GroupMember, WeightReceiver
from ziprl.policy import HFEngine


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
        assert got[name].dtype == dtype and got[name].shape == t.shape
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
    assert wide == sum(t.numel() * 4 for _, t in named) and narrow * 2 == wide
    assert wire_dtype(torch.bfloat16, "float32") == torch.bfloat16  # a bf16 learner never widens
    assert wire_dtype(torch.int64, "bfloat16") == torch.int64


def test_plan_buckets_respects_the_size_and_alignment():
    specs = [("a", "bfloat16", (10,), 2), ("b", "float32", (3, 3), 4), ("c", "bfloat16", (1000,), 2), ("d", "float32", (1,), 4)]
    plan = plan_buckets(specs, bucket_bytes=128)
    assert [[m.name for m in b] for b in plan] == [["a", "b"], ["c"], ["d"]]  # c alone: larger than a bucket
    assert [m.offset for m in plan[0]] == [0, ALIGN] and all(m.offset % ALIGN == 0 for b in plan for m in b)
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
    assert again == b and again.version == 7 and again.nbytes == b.nbytes
    with pytest.raises(ValueError, match="flat uint8"):
        unpack(plan[0], torch.zeros(4, dtype=torch.uint8))


def test_gloo_push_waits_for_the_batch_then_applies_and_ignores_older_versions(tiny_model_dir):
    """A receiver busy generating (its lock held) keeps the push pending; it is applied between batches."""
    engine = HFEngine(tiny_model_dir, dtype="bfloat16", device="cpu")
    receiver = WeightReceiver(engine)
    src = HFEngine(tiny_model_dir, dtype="float32", device="cpu").model
    with torch.no_grad():
        for p in src.parameters():
            p.add_(0.01)
    named = unique_named_tensors(src.named_parameters())
    plan = plan_for(named, "bfloat16", 64 << 10)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    members: dict[int, GroupMember] = {}
    threads = [threading.Thread(target=lambda r=r: members.__setitem__(r, GroupMember("127.0.0.1", port, r, 2, 60, "127.0.0.1")))
               for r in (0, 1)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    receiver.member = members[1]

    def push(version: int) -> None:
        members[0].send(version, len(plan), iter_packed(named, plan, lambda ps: torch.no_grad()))

    with receiver.lock:  # a batch is generating
        t = threading.Thread(target=push, args=(3,))
        t.start()
        assert receiver.receive([], 0) == 3
        t.join()
        assert engine.version == 0 and receiver.version == 3  # pending, not applied mid-batch
    receiver.apply_pending()
    assert engine.version == 3
    for name, p in named:
        assert torch.equal(engine.model.state_dict()[name].view(torch.int16), p.detach().bfloat16().view(torch.int16))
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    with torch.no_grad():
        for _, p in named:
            p.add_(1.0)
    t = threading.Thread(target=push, args=(2,))  # an older version: received (a collective), ignored
    t.start()
    assert receiver.receive([], 0) == 2
    t.join()
    assert engine.version == 3 and all(torch.equal(before[k], v) for k, v in engine.model.state_dict().items())
    assert np.isfinite(receiver.received_bytes) and receiver.received_bytes > 0
