"""The Serve retriever at scale, on a real local Ray cluster: shards behind a router give the unsharded
result, a caller beyond capacity gets back-pressure (and the client waits it out or fails clearly), and a
replica killed under load costs no query."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from ray.serve.exceptions import BackPressureError  # noqa: E402

from ziprl.actors.ray_utils import start_local_ray, stop_ray  # noqa: E402
from ziprl.actors.serve_retriever import RetrieverUnavailable, ServeRetrieverClient, deploy_retriever  # noqa: E402
from ziprl.config import RayConfig, RetrieverConfig  # noqa: E402
from ziprl.retrieval.corpus import load_corpus, write_corpus  # noqa: E402
from ziprl.retrieval.datasets import corpus_for  # noqa: E402
from ziprl.retrieval.retriever import Encoder, Retriever, build_index  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray_cluster]
N_DOCS = 40


@pytest.fixture(scope="module")
def passages():
    return load_corpus(corpus_for("sample"))[:N_DOCS]


@pytest.fixture(scope="module")
def indexes(tmp_path_factory, passages) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("scale")
    corpus, encoder = write_corpus(passages, tmp / "c.jsonl"), Encoder()
    return (build_index(corpus, tmp / "one", encoder, progress=False),
            build_index(corpus, tmp / "three", encoder, progress=False, shards=3))


@pytest.fixture(scope="module")
def cluster():
    start_local_ray(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    serve.shutdown()
    stop_ray()


def _queries(passages, n):
    return [f"{p.title} {' '.join(p.text.split()[:5])}" for p in passages[:n]]


def test_sharded_router_equals_unsharded(cluster, indexes, passages):
    one, three = indexes
    handle = deploy_retriever(RetrieverConfig(index_dir=str(three)), RayConfig(retriever_cpus=0.25), name="sharded")
    client = ServeRetrieverClient(handle)
    local = Retriever.load(one)
    queries = _queries(passages, 12)
    got, want = client.search(queries, 7), local.search(queries, 7)
    assert [[h.doc_id for h in hs] for hs in got] == [[h.doc_id for h in hs] for hs in want]
    assert all(abs(a.score - b.score) < 1e-4 for x, y in zip(got, want, strict=True) for a, b in zip(x, y, strict=True))
    assert client.open(passages[35].doc_id) == passages[35]  # lives in the last shard
    with pytest.raises(KeyError, match="nope"):
        client.open("nope")
    assert client.stats()["shards"] == 3
    assert client.stats()["num_docs"] == len(client) == N_DOCS
    rows = (0, 13, 14, 27, N_DOCS - 1)  # the router asks each shard's len() and maps a row into its shard
    assert [client.hit_at(r).doc_id for r in rows] == [local.hit_at(r).doc_id for r in rows]
    assert {d for d in serve.status().applications["sharded"].deployments} == {
        "sharded", "sharded_shard0", "sharded_shard1", "sharded_shard2"}
    serve.delete("sharded")


def test_back_pressure_is_an_error_that_the_client_waits_out(cluster, indexes, passages):
    one, _ = indexes
    ray_cfg = RayConfig(retriever_cpus=0.25, retriever_max_batch=1, retriever_max_queued=1)
    handle = deploy_retriever(RetrieverConfig(index_dir=str(one)), ray_cfg, name="tight")
    queries = _queries(passages, 1)
    responses = [handle.search.remote(queries, 3) for _ in range(30)]  # far beyond 2 running + 1 queued
    outcomes = []
    for r in responses:
        try:
            outcomes.append(r.result())
        except BackPressureError:
            outcomes.append("refused")
    answered = [[h.doc_id for h in o[0]] for o in outcomes if o != "refused"]
    assert "refused" in outcomes
    assert answered  # refused at once (any of the 30, the first too), not dropped silently
    assert all(ids == answered[0] for ids in answered)
    client = ServeRetrieverClient(handle, timeout_s=120)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: client.search(queries, 3), range(30)))
    ids = [[h.doc_id for h in r[0]] for r in results]  # scores may differ in the last bits between batches
    assert len(results) == 30
    assert all(i == ids[0] for i in ids)
    assert client.retries > 0  # it met the back-pressure and waited it out
    serve.delete("tight")


class _Refusing:
    """A handle whose every call is refused, as a deployment at capacity refuses."""

    def __getattr__(self, name):
        return self

    def remote(self, *args):
        raise BackPressureError(num_queued_requests=1, max_queued_requests=1)


def test_client_gives_up_with_a_clear_error_after_its_timeout():
    client = ServeRetrieverClient(_Refusing(), timeout_s=0.3)
    with pytest.raises(RetrieverUnavailable, match=r"did not answer search within 0.3 s \(last: BackPressureError\)"):
        client.search(["q"], 1)
    assert client.retries >= 1
    assert not isinstance(RetrieverUnavailable("x"), ValueError | KeyError)  # the env must not swallow it


def test_a_replica_killed_under_load_costs_no_query(cluster, indexes, passages):
    one, _ = indexes
    ray_cfg = RayConfig(retriever_replicas=2, retriever_cpus=0.25, retriever_max_batch=8)
    handle = deploy_retriever(RetrieverConfig(index_dir=str(one)), ray_cfg, name="killed")
    client = ServeRetrieverClient(handle, timeout_s=180)
    queries = _queries(passages, 8)
    want = [[h.doc_id for h in hs] for hs in Retriever.load(one).search(queries, 3)]
    done, started = [], threading.Event()

    def worker(i: int):
        for j in range(6):
            started.set()
            hits = client.search([queries[(i + j) % 8]], 3)
            done.append([h.doc_id for h in hits[0]] == want[(i + j) % 8])

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(worker, i) for i in range(8)]
        started.wait()
        replicas = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["name"].startswith("SERVE_REPLICA::killed#")]
        ray.kill(ray.get_actor(replicas[0], namespace="serve"), no_restart=True)
        for f in futures:
            f.result()
    assert len(done) == 48
    assert all(done)  # every query answered, and answered right
    serve.delete("killed")
