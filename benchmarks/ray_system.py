"""Ray system benchmarks: (a) Serve vs in-process retrieval, (b) weight push to N actors, (c) rollout scaling.

    .venv/bin/python benchmarks/ray_system.py [--parts abc] [--real-model] [--cpus N] [--retriever-cpus N]
        [--max-actors 4]

Goals: (a) Serve >= 0.8x in-process queries/s at batch >= 16 (one replica with as many CPUs as the
in-process run has threads); (b) warm push to N actors <= 1.3x the push to 1 actor, and warm push
<= 1 s, for a 135M-parameter float32 state dict (~540 MB; the CPU default engine runs in float32, so it
travels in float32), over the driver's path (``RaySender``, both transports) from the learner actor
class to rollout-actor-class receivers whose real HFEngine applies it; (c) rollout tokens/s with 2 actors
>= 1.6x one actor.
Results go to benchmarks/results/ray_system.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import ray

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, at_least, write_results  # noqa: E402
from weight_sync import FixedWeightsLearner, model_shapes  # noqa: E402

from ziprl.actors.ray_utils import init_ray  # noqa: E402
from ziprl.actors.rollout_actor import RolloutWorker  # noqa: E402
from ziprl.actors.serve_retriever import ServeRetrieverClient, deploy_retriever  # noqa: E402
from ziprl.actors.weight_sender import RaySender  # noqa: E402
from ziprl.config import RayConfig, RetrieverConfig, ZipRLConfig  # noqa: E402

BATCHES = (1, 16, 64)
K = 5
MEASUREMENTS = {"a": "retrieval", "b": "push", "c": "rollouts"}  # --parts letters
SINK_CPUS, LEARNER_CPUS = 0.25, 0.01  # Ray CPUs of each (b) push receiver and of its sender


def parts(text: str) -> str:
    """An argparse ``type``: letters of :data:`MEASUREMENTS`, returned once each, in order (``ca`` -> ``ac``)."""
    if not text or set(text) - set(MEASUREMENTS):
        known = ", ".join(f"{k} ({v})" for k, v in MEASUREMENTS.items())
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: use letters of {known}, e.g. abc or b")
    return "".join(k for k in MEASUREMENTS if k in text)


def state_dict_135m(real_model: bool) -> tuple[dict[str, np.ndarray], str]:
    """The real SmolLM2-135M float32 weights (``--real-model``) or random arrays of the same shapes."""
    if real_model:
        from ziprl.config import ModelConfig
        from ziprl.policy.models import load_model, resolve_model_path

        model = load_model(resolve_model_path(ModelConfig()))
        return {k: v.detach().numpy() for k, v in model.named_parameters()}, "SmolLM2-135M-Instruct"
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(s, dtype=np.float32) for k, s in model_shapes("135M").items()}, "random, SmolLM2-135M shapes"


def queries(n: int) -> list[str]:
    """Distinct natural-language queries (question-like, as an agent would issue them)."""
    subjects = ["the capital of", "the author of", "the population of", "the founder of", "the river through",
                "the director of", "the largest city in", "the language of"]
    things = ["France", "Hamlet", "Tokyo", "Microsoft", "Vienna", "Inception", "Australia", "Brazil", "Egypt",
              "the Roman Empire", "Canada", "Norway", "the Beatles", "Kenya", "Peru", "Mars"]
    return [f"what is {subjects[i % len(subjects)]} {things[(i // len(subjects)) % len(things)]} ({i})" for i in range(n)]


def _seconds(fn, qs: list[str], batch: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(qs), batch):
        fn(qs[i : i + batch])
    return time.perf_counter() - start


def retrieval_throughput(retriever_cfg: RetrieverConfig, cpus: float, total: int = 128, rounds: int = 5) -> list[dict]:
    """(a) queries/s of the in-process Retriever vs the Serve deployment at each client batch size.

    The two run in alternating rounds (the machine is shared) and each keeps its median round.
    ``serve_overhead_ms`` = per call, wall time minus the replica's own encoder + FAISS time.
    """
    from ray import serve

    from ziprl.retrieval.retriever import Retriever

    local = Retriever.from_config(retriever_cfg)
    ray_cfg = RayConfig(retriever_replicas=1, retriever_cpus=cpus, retriever_max_batch=max(BATCHES))
    client = ServeRetrieverClient(deploy_retriever(retriever_cfg, ray_cfg, name="bench_retriever"))
    qs = queries(total)
    local.search(qs[: max(BATCHES)], K)  # warm-up
    client.search(qs[: max(BATCHES)], K)
    rows = []
    for b in BATCHES:
        n = total if b > 1 else total // 4
        in_proc, served, overhead = [], [], []
        for _ in range(rounds):
            in_proc.append(n / _seconds(lambda q: local.search(q, K), qs[:n], b))
            inner = client.stats()["search_s"]
            wall = _seconds(lambda q: client.search(q, K), qs[:n], b)
            served.append(n / wall)
            overhead.append((wall - (client.stats()["search_s"] - inner)) / (n / b) * 1e3)
        a, s = statistics.median(in_proc), statistics.median(served)
        rows.append({"measure": "retrieval_qps", "batch": b, "in_process_qps": round(a, 1), "serve_qps": round(s, 1),
                     "serve_over_in_process": round(s / a, 3),
                     "serve_overhead_ms": round(statistics.median(overhead), 1)})
    serve.delete("bench_retriever")
    return rows


class EngineSink(RolloutWorker):
    """The rollout actor class with its real engine (no retriever): applies pushes the way RolloutActor does."""

    def __init__(self, model_path: str):
        import torch

        from ziprl.policy import HFEngine

        torch.set_num_threads(1)
        self.engine = HFEngine(model_path, device="cpu")
        self.ids = torch.ones(1, 16, dtype=torch.long)

    def forward_s(self) -> float:
        """Seconds of one 16-token forward pass; right after a push it includes touching the new weights."""
        import torch

        start = time.perf_counter()
        with torch.inference_mode():
            self.engine.model(input_ids=self.ids)
        return time.perf_counter() - start


def weight_push(state_dict: dict[str, np.ndarray], actors: int, model_path: str, transport: str,
                repeats: int = 7) -> dict:
    """(b) seconds of ``RaySender.push`` until every actor's engine has the weights: first push (cold) and the
    median of the rest (warm); plus actor 0's first forward pass after each push against its next one, so any
    cost moved from the push into the next generation shows."""
    import torch

    from ziprl.weights.buckets import unique_named_tensors

    cfg = ZipRLConfig()
    cfg.weights.transport = transport
    named = unique_named_tensors((k, torch.from_numpy(v)) for k, v in state_dict.items())
    learner = ray.remote(num_cpus=LEARNER_CPUS)(FixedWeightsLearner).remote(cfg.to_dict(), named=named)
    sinks = [ray.remote(num_cpus=SINK_CPUS, concurrency_groups={"weights": 1})(EngineSink).remote(model_path)
             for _ in range(actors)]
    ray.get([s.node_ip.remote() for s in sinks])
    sync = RaySender(cfg, SimpleNamespace(actors=[learner]), sinks)
    times, first, steady, nbytes = [], [], [], 0
    for v in range(1, repeats + 1):
        stats = sync.push(v, wait=True)
        times.append(stats["seconds"])
        nbytes = stats["bytes"]
        first.append(ray.get(sinks[0].forward_s.remote()))
        steady.append(ray.get(sinks[0].forward_s.remote()))
    sync.close()
    for a in [learner, *sinks]:
        ray.kill(a)
    return {"measure": "weight_push", "transport": transport, "actors": actors, "mb": round(nbytes / 1e6, 1),
            "cold_s": round(times[0], 3), "warm_s": round(statistics.median(times[1:]), 3),
            "forward_after_push_s": round(statistics.median(first[1:]), 3),
            "forward_steady_s": round(statistics.median(steady[1:]), 3)}


def rollout_throughput(actors: int, batches: int = 3) -> dict:
    """(c) Generated tokens/s of ``actors`` rollout actors (1 torch thread each) on the same per-actor work."""
    from ziprl.actors.rollout_actor import RolloutActor, example_dicts
    from ziprl.actors.serve_retriever import deploy_retriever
    from ziprl.config import load_config
    from ziprl.policy import resolve_model_path
    from ziprl.retrieval.datasets import load_dataset

    cfg: ZipRLConfig = load_config(None, ["env.max_turns=3", "sampling.max_new_tokens=48", "rollout.group_size=2",
                                          "ray.retriever_cpus=0.2"])
    handle = deploy_retriever(cfg.retriever, cfg.ray, name=f"retriever{actors}")
    path = str(resolve_model_path(cfg.model))
    pool = [RolloutActor.options(num_cpus=0.01).remote(cfg.to_dict(), path, handle, i, 1) for i in range(actors)]
    exs = load_dataset("sample")
    ray.get([a.run_batch.remote(example_dicts(exs[:1]), 0) for a in pool])  # warm-up: load, first generation
    start = time.perf_counter()
    refs = [a.run_batch.remote(example_dicts(exs[1 + i * batches + b:][:1]), b) for i, a in enumerate(pool)
            for b in range(batches)]
    stats = [st for _, st in ray.get(refs)]
    wall = time.perf_counter() - start
    for a in pool:
        ray.kill(a)
    tokens = sum(st["tokens"] for st in stats)
    return {"measure": "rollout_throughput", "actors": actors, "tokens": tokens, "wall_s": round(wall, 2),
            "tokens_per_s": round(tokens / wall, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cores = os.cpu_count() or 1
    ap.add_argument("--cpus", type=at_least(1), default=cores, help="CPUs of the local Ray cluster")
    ap.add_argument("--retriever-cpus", type=at_least(0.0001, float), default=None,
                    help="(a) CPUs (= encoder threads) of the replica, at most --cpus; default: --cpus, as many as "
                         "the in-process run uses")
    ap.add_argument("--real-model", action="store_true", help="push the real SmolLM2-135M weights")
    ap.add_argument("--max-actors", type=at_least(1), default=4, help="(b) pushes to 1 and to this many actors")
    ap.add_argument("--parts", type=parts, default="abc",
                    help="which measurements, letters of: a (retrieval), b (push), c (rollouts)")
    args = ap.parse_args(argv)
    if args.retriever_cpus is None:
        args.retriever_cpus = float(args.cpus)
    if "a" in args.parts and args.retriever_cpus > args.cpus:
        ap.error(f"--retriever-cpus {args.retriever_cpus:g}: the replica would not fit the Ray cluster's --cpus "
                 f"{args.cpus}; give at most {args.cpus}, or raise --cpus")
    if "b" in args.parts and args.max_actors * SINK_CPUS + LEARNER_CPUS > args.cpus:
        ap.error(f"--max-actors {args.max_actors}: {args.max_actors} receivers of {SINK_CPUS} CPU each would not fit "
                 f"the Ray cluster's --cpus {args.cpus}; give at most {int((args.cpus - LEARNER_CPUS) / SINK_CPUS)}, "
                 "or raise --cpus")

    load_before = os.getloadavg()[0]
    init_ray(RayConfig(), num_cpus=args.cpus)
    rows = retrieval_throughput(RetrieverConfig(), args.retriever_cpus) if "a" in args.parts else []
    sd, source = state_dict_135m(args.real_model) if "b" in args.parts else ({}, "-")
    if "b" in args.parts:
        from ziprl.config import ModelConfig
        from ziprl.policy import resolve_model_path

        model_path = str(resolve_model_path(ModelConfig()))
        for transport in ("object_store", "collective"):
            push = [weight_push(sd, n, model_path, transport) for n in sorted({1, args.max_actors})]
            for r in push:
                r["over_1_actor"] = round(r["warm_s"] / push[0]["warm_s"], 3)
            rows += push
    if "c" in args.parts:
        one, two = rollout_throughput(1), rollout_throughput(2)
        two["over_1_actor"] = round(two["tokens_per_s"] / one["tokens_per_s"], 3)
        rows += [one, two]
    meta = {"parts": args.parts, "ray": ray.__version__, "ray_cpus": args.cpus,
            "host_load_avg_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],  # before, after
            "goals": "serve/in-process >= 0.8 at batch >= 16; push N/1 <= 1.3; warm push <= 1 s; "
                     "rollouts 2/1 actors >= 1.6"}
    if "a" in args.parts:
        meta |= {"index": "shipped sample (RetrieverConfig defaults)", "k": K, "retriever_cpus": args.retriever_cpus}
    if "b" in args.parts:
        meta |= {"weights": source, "params": int(sum(a.size for a in {id(a): a for a in sd.values()}.values()))}
    previous = RESULTS / "ray_system.json"  # a partial run replaces only the parts it measured
    if args.parts != "abc" and previous.is_file():
        old = json.loads(previous.read_text())
        measured = {r["measure"] for r in rows}
        rows = [r for r in old["rows"] if r["measure"] not in measured] + rows
        meta = old["meta"] | meta
    write_results("ray_system", rows, meta)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
