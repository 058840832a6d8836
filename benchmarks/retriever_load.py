"""Load test of the Serve retriever on 127.0.0.1: many concurrent clients, a replica killed mid-test.

    nice -n 10 .venv/bin/python benchmarks/retriever_load.py [--clients 32] [--requests 20] [--replicas 2]

A local Ray cluster serves the shipped sample index (2000 passages, MiniLM) with ``--replicas``
replicas. ``--clients`` client threads, spread over 4 Ray actor processes as rollout actors would be,
each send ``--requests`` one-query searches through :class:`ServeRetrieverClient` (retries on
back-pressure and dead replicas, ``--timeout`` seconds per call). After a third of all requests one
replica is killed. Recorded: latency p50/p99, requests answered, wrong answers (compared with the
in-process retriever), errors, time-outs, client retries, Serve's back-pressure refusals seen by
clients. Bounded by request count and by ``--max-s`` seconds. Results: benchmarks/results/retriever_load.*.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

ACTORS = 4


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=20, help="per client")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-queued", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=120.0, help="client timeout per call (s)")
    ap.add_argument("--max-s", type=float, default=900.0, help="stop sending new requests after this long")
    args = ap.parse_args(argv)

    import ray
    from ray import serve

    from ziprl.actors.serve_retriever import RetrieverUnavailable, ServeRetrieverClient, deploy_retriever
    from ziprl.config import RayConfig, RetrieverConfig
    from ziprl.retrieval.corpus import load_corpus
    from ziprl.retrieval.datasets import corpus_for
    from ziprl.retrieval.retriever import Retriever

    passages = load_corpus(corpus_for("sample"))
    rng = np.random.default_rng(0)
    queries = [f"{p.title} {' '.join(p.text.split()[:8])}" for p in (passages[i] for i in rng.choice(len(passages), 64))]
    expected = [[h.doc_id for h in hs] for hs in Retriever.from_config(RetrieverConfig()).search(queries, 5)]

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray_cfg = RayConfig(retriever_replicas=args.replicas, retriever_cpus=0.25, retriever_max_batch=args.max_batch,
                        retriever_max_queued=args.max_queued, retriever_timeout_s=args.timeout)
    handle = deploy_retriever(RetrieverConfig(), ray_cfg, name="load")
    kill_at = args.clients * args.requests // 3

    @ray.remote(num_cpus=0)
    class Clients:
        """One process of rollout-actor stand-ins: ``threads`` clients, each sending one query at a time."""

        def run(self, handle, threads: int, first: int, deadline: float) -> list[tuple]:
            client = ServeRetrieverClient(handle, args.timeout)
            out = []

            def one(c: int) -> None:
                for j in range(args.requests):
                    if time.time() > deadline:
                        return
                    q = (first + c * 7 + j) % len(queries)
                    t0 = time.perf_counter()
                    try:
                        hits = client.search([queries[q]], 5)
                        out.append(("ok", time.perf_counter() - t0, [h.doc_id for h in hits[0]] == expected[q]))
                    except RetrieverUnavailable:
                        out.append(("timeout", time.perf_counter() - t0, False))
                    except Exception as exc:  # noqa: BLE001 - counted as an error, with its type
                        out.append((type(exc).__name__, time.perf_counter() - t0, False))

            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, range(threads)))
            return out + [("retries", float(client.retries), True)]

    per = [args.clients // ACTORS + (i < args.clients % ACTORS) for i in range(ACTORS)]
    actors = [Clients.remote() for _ in range(ACTORS)]
    t0 = time.time()
    refs = [a.run.remote(handle, n, i * 100, t0 + args.max_s) for i, (a, n) in enumerate(zip(actors, per, strict=True))]

    killed, watcher = None, ServeRetrieverClient(handle)
    while killed is None and time.time() - t0 < args.max_s:
        time.sleep(0.5)
        served = watcher.stats()["queries"]  # of the replica that answers: about 1/replicas of all
        replicas = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["name"].startswith("SERVE_REPLICA::load#")]
        if served >= kill_at / args.replicas and replicas:
            ray.kill(ray.get_actor(replicas[0], namespace="serve"), no_restart=True)
            killed = time.time() - t0
    results = [x for ref in refs for x in ray.get(ref)]
    wall = time.time() - t0
    retries = sum(int(x[1]) for x in results if x[0] == "retries")
    calls = [x for x in results if x[0] != "retries"]
    ok = [x for x in calls if x[0] == "ok"]
    lat = np.array([x[1] for x in ok]) * 1000
    row = {"clients": args.clients, "replicas": args.replicas, "requests": len(calls), "answered": len(ok),
           "wrong": sum(not x[2] for x in ok), "timeouts": sum(x[0] == "timeout" for x in calls),
           "errors": sum(x[0] not in ("ok", "timeout") for x in calls), "client_retries": retries,
           "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
           "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
           "max_ms": float(lat.max()) if len(lat) else None, "qps": len(ok) / wall, "wall_s": wall,
           "replica_killed_at_s": killed}
    serve.shutdown()
    ray.shutdown()
    write_results("retriever_load", [row], {"max_batch": args.max_batch, "max_queued": args.max_queued,
                                             "timeout_s": args.timeout, "actors": ACTORS, "index": "shipped sample",
                                             "bind": "127.0.0.1 (DeploymentHandle; no HTTP proxy)"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
