"""Weight publishing: numpy conversion, publish-once to many actors, versioning, staleness rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from ziprl.actors.weights import (  # noqa: E402
    WeightPublisher,
    WeightRef,
    is_fresh,
    load_numpy_state_dict,
    state_dict_to_numpy,
)


def _model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Embedding(11, 6), torch.nn.Linear(6, 5), torch.nn.LayerNorm(5))
    return m.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_numpy_round_trip_is_exact(dtype):
    src = _model(dtype)
    arrays = state_dict_to_numpy(src)
    assert set(arrays) == set(src.state_dict())
    for name, t in src.state_dict().items():
        a = arrays[name]
        assert a.dtype == np.float32 and a.flags.c_contiguous and a.shape == tuple(t.shape)
        assert torch.equal(torch.from_numpy(a).to(dtype), t)
    dst = _model(dtype)
    for p in dst.parameters():
        p.data.zero_()
    load_numpy_state_dict(dst, arrays)
    for name, t in src.state_dict().items():
        assert dst.state_dict()[name].dtype == dtype
        assert torch.equal(dst.state_dict()[name], t)


def test_tied_weights_become_one_array():
    emb, head = torch.nn.Embedding(7, 3), torch.nn.Linear(3, 7, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    for copy in (True, False):
        arrays = state_dict_to_numpy(model, copy=copy)
        assert arrays["emb.weight"] is arrays["head.weight"]


def test_non_contiguous_and_copy_semantics():
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    arrays = state_dict_to_numpy({"w": w.t(), "n": np.arange(3)})
    assert arrays["w"].flags.c_contiguous and np.array_equal(arrays["w"], w.t().numpy())
    assert np.array_equal(arrays["n"], np.arange(3))
    owned = state_dict_to_numpy({"w": w})
    shared = state_dict_to_numpy({"w": w}, copy=False)
    w.add_(1)
    assert owned["w"][0, 0] == 0 and shared["w"][0, 0] == 1
    with pytest.raises(TypeError, match="mapping of tensors"):
        state_dict_to_numpy(42)


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@ray.remote(num_cpus=0)
class Subscriber:
    def __init__(self):
        self.version = 0
        self.buf: dict[str, np.ndarray] = {}

    def update_weights(self, wr: WeightRef) -> tuple[int, str, float]:
        arrays = ray.get(wr.ref)
        self.buf = {k: np.array(v) for k, v in arrays.items()}
        self.version = wr.version
        return wr.version, wr.ref.hex(), float(sum(v.sum() for v in self.buf.values()))


def test_publish_once_to_many_subscribers(ray_cluster):
    subs = [Subscriber.remote() for _ in range(3)]
    pub = WeightPublisher(subs)
    assert pub.version == 0 and pub.latest is None
    model = _model()
    total = float(sum(v.sum() for v in state_dict_to_numpy(model).values()))

    wr = pub.publish(model)
    assert wr.version == 1 and pub.latest is wr and wr.seconds > 0
    assert wr.nbytes == sum(p.numel() * 4 for p in model.state_dict().values())
    acks = pub.wait(timeout=60)
    assert {(v, h) for v, h, _ in acks} == {(1, wr.ref.hex())}  # one put, one ref for all
    assert all(s == pytest.approx(total) for _, _, s in acks)

    with torch.no_grad():
        model[1].weight.add_(1.0)
    wr2 = pub.publish(model)
    assert wr2.version == 2 and wr2.ref.hex() != wr.ref.hex()
    assert {(v, h) for v, h, _ in pub.wait(timeout=60)} == {(2, wr2.ref.hex())}

    late = Subscriber.remote()
    pub.subscribe(late)  # a late joiner gets the latest version at once
    assert [a[:2] for a in pub.wait(timeout=60)] == [(2, wr2.ref.hex())]


@pytest.mark.parametrize(
    ("traj", "current", "max_staleness", "fresh"),
    [
        (5, 5, 0, True),
        (4, 5, 0, False),
        (4, 5, 1, True),
        (3, 5, 1, False),
        (3, 5, 2, True),
        (0, 5, 10, True),
    ],
)
def test_is_fresh_table(traj, current, max_staleness, fresh):
    assert is_fresh(traj, current, max_staleness) is fresh


def test_is_fresh_rejects_impossible_inputs():
    with pytest.raises(ValueError, match="max_staleness"):
        is_fresh(1, 1, -1)
    with pytest.raises(ValueError, match="newer"):
        is_fresh(3, 2, 1)
