"""Weight push: object store vs collective (gloo), 1 and 4 receivers, synthetic bf16 models of 0.1B-1.5B.

    nice -n 10 .venv/bin/python benchmarks/weight_sync.py [--sizes 0.1B,0.5B,1.5B] [--receivers 1,4]
        [--bucket-mb 256] [--repeats 3] [--max-gb 9] [--name weight_sync]

The sender is the real learner actor class (LearnerWorker, whose ``learner_weights`` are replaced by synthetic
bf16 tensors with the shapes of a Llama/Qwen-style model); the receivers are the real RolloutWorker class
with a stand-in engine that drops what it is given (the model itself is not what is measured); the pushes go
through :class:`ziprl.actors.weight_sender.RaySender`, the path the driver takes. One push = from
``RaySender.push`` until every receiver has the weights (``wait=True``). ``fp32_baseline`` rows push the same
model widened to float32: the bytes of the previous path, which widened bf16 to float32 numpy arrays.
``cpu_s`` is the CPU time (user + system, via psutil) that the sender and all receivers spent per warm push;
``cpu_floor_s`` = ``cpu_s`` / the cores: no schedule of that work finishes the push faster on this box.
Goals: 16-bit pushes move 0.5x the bytes of the fp32 path; collective to 4 receivers <= 1.3x to one.
Results: benchmarks/results/<--name, default weight_sync>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import ray
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, at_least, listed, one_of, plots_name, write_results  # noqa: E402

from ziprl.actors.learner_actor import LearnerWorker  # noqa: E402
from ziprl.actors.rollout_actor import RolloutWorker  # noqa: E402
from ziprl.actors.weight_sender import RaySender  # noqa: E402
from ziprl.config import ZipRLConfig  # noqa: E402
from ziprl.weights import LearnerWeights, WeightReceiver  # noqa: E402

# hidden, layers, MLP, KV width, vocab (Qwen2.5-0.5B / -1.5B shapes; a GPT-2-small-like 0.1B)
SHAPES = {"0.1B": (768, 12, 2048, 256, 32000), "0.5B": (896, 24, 4864, 128, 151936),
          "1.5B": (1536, 28, 8960, 256, 151936),
          "135M": (576, 30, 1536, 192, 49152)}  # SmolLM2-135M (the embedded default; ray_system.py)


TRANSPORTS = ("object_store", "collective")


def model_shapes(size: str) -> dict[str, tuple[int, ...]]:
    d, layers, mlp, kv, vocab = SHAPES[size]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (kv, d),
                   p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, d),
                   p + "mlp.gate_proj.weight": (mlp, d), p + "mlp.up_proj.weight": (mlp, d),
                   p + "mlp.down_proj.weight": (d, mlp), p + "input_layernorm.weight": (d,),
                   p + "post_attention_layernorm.weight": (d,)}
    return shapes


def n_params(size: str) -> int:
    return sum(int(torch.Size(s).numel()) for s in model_shapes(size).values())


class FixedWeightsLearner(LearnerWorker):
    """The learner actor with given (``named``) or synthetic (``size``, ``dtype``) weights instead of a trainer."""

    def __init__(self, cfg: dict, named: list | None = None, size: str = "0.1B", dtype: str = "bfloat16"):
        super().__init__(cfg)
        torch.set_num_threads(1)
        self.named = named if named is not None else [
            (n, torch.full(s, 1e-3 * i, dtype=getattr(torch, dtype))) for i, (n, s) in enumerate(model_shapes(size).items())]

    def learner_weights(self) -> LearnerWeights:
        return LearnerWeights(self.named, lambda ps: contextlib.nullcontext(), "cpu", 0, False, self.cfg.model.dtype,
                              WeightReceiver)


class NullEngine(WeightReceiver):
    """Stand-in engine: takes the weights (checking names and byte count) and drops them; it receives a collective
    push on ZipRL's group, as an HFEngine does."""

    def __init__(self):
        self.version, self.bytes = 0, 0

    def load_weights(self, named: dict, version: int) -> None:
        self.bytes = sum(t.numel() * t.element_size() for t in named.values())
        self.version = version


class Sink(RolloutWorker):
    """The rollout actor class with a :class:`NullEngine` (no model, no retriever)."""

    def __init__(self):
        torch.set_num_threads(1)
        self.engine = NullEngine()

    def loaded_bytes(self) -> int:
        return self.engine.bytes


def measure(size: str, transport: str, receivers: int, dtype: str, bucket_mb: float, repeats: int,
            cores: int) -> dict:
    cfg = ZipRLConfig()
    cfg.model.dtype = dtype
    cfg.weights.transport, cfg.weights.bucket_mb, cfg.weights.rendezvous_timeout_s = transport, bucket_mb, 600
    learner = ray.remote(num_cpus=0.5)(FixedWeightsLearner).remote(cfg.to_dict(), size=size, dtype=dtype)
    sinks = [ray.remote(num_cpus=0.25, concurrency_groups={"weights": 1})(Sink).remote() for _ in range(receivers)]
    procs = [psutil.Process(p) for p in ray.get([a.__ray_call__.remote(lambda self: os.getpid())  # all started
                                                  for a in [learner, *sinks]])]
    t0 = time.perf_counter()
    sync = RaySender(cfg, SimpleNamespace(actors=[learner]), sinks)
    setup = time.perf_counter() - t0
    times, cpu, stats = [], [], {}
    for v in range(1, repeats + 2):  # the first push warms up (page faults, connections)
        before = cpu_seconds(procs)
        stats = sync.push(v, wait=True)
        times.append(stats["seconds"])
        cpu.append(cpu_seconds(procs) - before)
    loaded = ray.get([s.loaded_bytes.remote() for s in sinks])
    assert all(b == stats["bytes"] for b in loaded), (loaded, stats["bytes"])
    sync.close()
    for a in [learner, *sinks]:
        ray.kill(a)
    warm, warm_cpu = statistics.median(times[1:]), statistics.median(cpu[1:])
    return {"params": size, "dtype": dtype, "transport": transport, "receivers": receivers,
            "mb_per_push": round(stats["bytes"] / 1e6, 1), "cold_s": round(times[0], 3), "warm_s": round(warm, 3),
            "gb_per_s": round(stats["bytes"] / warm / 1e9, 3), "setup_s": round(setup, 2),
            "cpu_s": round(warm_cpu, 3), "cpu_floor_s": round(warm_cpu / cores, 3)}


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """User + system CPU seconds the processes have used so far (all their threads)."""
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def extrapolate(rows: list[dict]) -> list[dict]:
    """Bytes and seconds per push for 8B parameters: bytes exact (2 per weight), seconds at the throughput
    measured for the largest model per (transport, receivers)."""
    out = []
    for (transport, receivers) in sorted({(r["transport"], r["receivers"]) for r in rows if r["dtype"] == "bfloat16"}):
        big = max((r for r in rows if r["dtype"] == "bfloat16" and r["transport"] == transport
                   and r["receivers"] == receivers), key=lambda r: r["mb_per_push"])
        gb = 8e9 * 2 / 1e9
        out.append({"params": "8B (extrapolated)", "dtype": "bfloat16", "transport": transport,
                    "receivers": receivers, "mb_per_push": gb * 1e3, "warm_s": round(gb / big["gb_per_s"], 1),
                    "gb_per_s": big["gb_per_s"], "from": big["params"], "fp32_path_mb": 8e9 * 4 / 1e6})
    return out


def plot(rows: list[dict], name: str) -> None:
    from ziprl.plots import _plt, save_figure

    fig, ax = _plt().subplots(figsize=(6, 4))
    for key in sorted({(r["transport"], r["receivers"]) for r in rows if r["dtype"] == "bfloat16"}):
        pts = sorted((n_params(r["params"]), r["warm_s"]) for r in rows
                     if r["dtype"] == "bfloat16" and (r["transport"], r["receivers"]) == key and r["params"] in SHAPES)
        ax.plot([p / 1e9 for p, _ in pts], [s for _, s in pts], marker="o", label=f"{key[0]}, {key[1]} receiver(s)")
    ax.set_xlabel("parameters (billions, bf16)")
    ax.set_ylabel("seconds per push (warm)")
    ax.set_title("Weight push on this CPU (Ray local cluster)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, RESULTS / f"{name}.png")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=listed(one_of(SHAPES)), default="0.1B,0.5B,1.5B",
                    help=f"comma-separated model sizes, of {', '.join(SHAPES)}")
    ap.add_argument("--receivers", type=listed(at_least(1)), default="1,4",
                    help="comma-separated receiver counts, each measured")
    ap.add_argument("--transports", type=listed(one_of(TRANSPORTS)), default=",".join(TRANSPORTS),
                    help=f"comma-separated, of {', '.join(TRANSPORTS)}")
    ap.add_argument("--bucket-mb", type=at_least(1.0, float), default=256.0,
                    help="weights.bucket_mb: MiB per bucket the sender packs")
    ap.add_argument("--repeats", type=at_least(1), default=3,
                    help="warm pushes per setting (after one warm-up push; 2 for models of 2 GB or more)")
    ap.add_argument("--name", type=plots_name(), default="weight_sync", help="results file stem under benchmarks/results")
    ap.add_argument("--max-gb", type=at_least(0.0, float), default=9.0,
                    help="skip settings whose weights in memory (sender + collective receivers' copies) exceed this")
    args = ap.parse_args(argv)
    sizes, receivers = list(dict.fromkeys(args.sizes)), list(dict.fromkeys(args.receivers))
    plan = [(s, t, n, "bfloat16") for s in sizes for t in dict.fromkeys(args.transports) for n in receivers]
    base = min(sizes, key=n_params)
    plan += [(base, "object_store", 1, "float32")]  # the previous path's bytes: bf16 widened to float32
    load_before = os.getloadavg()[0]
    rows, skipped, runnable, needs = [], [], [], []
    for size, transport, n, dtype in plan:
        gb = n_params(size) * (2 if dtype == "bfloat16" else 4) / 1e9
        need = gb * (1 + (n if transport == "collective" else 1))  # object store: one shared copy
        needs.append(need)
        if need > args.max_gb:
            skipped.append(f"{size} {transport} x{n} {dtype}: needs ~{need:.1f} GB (> --max-gb {args.max_gb:g})")
        else:
            runnable.append((size, transport, n, dtype, gb))
    if not runnable:
        ap.error(f"--max-gb {args.max_gb:g}: every setting needs more memory (the smallest ~{min(needs):.2f} GB); "
                 "raise --max-gb or give smaller --sizes")
    store = max(gb for *_, gb in runnable) * 2.5e9 + 5e8  # two versions in flight
    cores = min(4, os.cpu_count() or 1)  # Ray is given 4 logical CPUs; the box may have fewer cores
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, object_store_memory=int(store))
    for size, transport, n, dtype, gb in tqdm(runnable, desc="weight_sync", unit="setting"):
        rows.append(measure(size, transport, n, dtype, args.bucket_mb, args.repeats if gb < 2 else 2, cores))
        tqdm.write(str(rows[-1]))
    ray.shutdown()
    for r in rows:
        one = next((o for o in rows if (o["params"], o["dtype"], o["transport"], o["receivers"])
                    == (r["params"], r["dtype"], r["transport"], 1)), None)
        if one is not None:
            r["over_1_receiver"] = round(r["warm_s"] / one["warm_s"], 3)
            r["floor_over_1_receiver"] = round(r["cpu_floor_s"] / one["warm_s"], 3)
    fp32 = next((r for r in rows if r["dtype"] == "float32"), None)
    bf16 = next((r for r in rows if r["dtype"] == "bfloat16" and r["params"] == base
                 and r["transport"] == "object_store" and r["receivers"] == 1), None)
    meta = {"bucket_mb": args.bucket_mb, "ray": ray.__version__, "torch": torch.__version__, "skipped": skipped,
            "host_load_avg_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            "goals": "bf16 bytes / fp32-path bytes = 0.5; collective 4 receivers / 1 receiver <= 1.3",
            "params": {s: n_params(s) for s in sizes}}
    if fp32 and bf16:
        meta["bf16_over_fp32_bytes"] = round(bf16["mb_per_push"] / fp32["mb_per_push"], 4)
        meta["bf16_over_fp32_seconds"] = round(bf16["warm_s"] / fp32["warm_s"], 3)
    write_results(args.name, rows + extrapolate(rows), meta)
    plot(rows, args.name)
    print({k: meta[k] for k in ("skipped", "host_load_avg_1m") if k in meta},
          meta.get("bf16_over_fp32_bytes"), meta.get("bf16_over_fp32_seconds"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
