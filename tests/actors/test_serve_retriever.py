"""The retriever as a Ray Serve deployment, on a real local Ray cluster over a tiny real FAISS index."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
requests = pytest.importorskip("requests")

from tests.conftest import REPO, SHARED  # noqa: E402
from ziprl.actors.ray_utils import start_local_ray, stop_ray  # noqa: E402
from ziprl.actors.serve_retriever import (  # noqa: E402
    MAX_K,
    RetrieverDeployment,
    ServeRetrieverClient,
    deploy_retriever,
)
from ziprl.config import RayConfig, RetrieverConfig  # noqa: E402
from ziprl.retrieval.corpus import write_corpus  # noqa: E402
from ziprl.retrieval.retriever import Encoder, Retriever, RetrieverError, UnknownDocument, build_index  # noqa: E402
from ziprl.retrieval.types import Hit, Passage  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray_cluster]

SAMPLE = REPO / "ziprl" / "data" / "sample" / "corpus.jsonl.gz"
WIKI = SHARED / "wiki18_passages_sample" / "flashrag_wiki18_sample_1000.jsonl.gz"
N_DOCS = 50


def _passages() -> list[Passage]:
    """The first 50 passages of the shipped sample corpus, else of the shared wiki18 sample."""
    if SAMPLE.is_file():
        from ziprl.retrieval.corpus import load_corpus

        return load_corpus(SAMPLE)[:N_DOCS]
    if not WIKI.is_file():
        pytest.skip("no sample corpus: neither ziprl/data/sample/corpus.jsonl.gz nor the shared wiki18 sample")
    out = []
    with gzip.open(WIKI, "rt", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            title, _, text = rec["contents"].partition("\n")
            out.append(Passage(doc_id=rec["id"], title=title.strip('"'), text=text))
            if len(out) == N_DOCS:
                break
    return out


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    return _passages()


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder()


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, passages, encoder) -> Path:
    tmp = tmp_path_factory.mktemp("serve_index")
    return build_index(write_corpus(passages, tmp / "corpus.jsonl"), tmp / "index", encoder, progress=False)


@pytest.fixture(scope="module")
def local(index_dir, encoder) -> Retriever:
    return Retriever.load(index_dir, encoder, RetrieverConfig().snippet_chars)  # as the deployment loads it


@pytest.fixture(scope="module")
def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TOKEN = "test-token"


@pytest.fixture(scope="module")
def client(index_dir, port):
    mp = pytest.MonkeyPatch()
    mp.setenv("ZIPRL_HTTP_TOKEN", TOKEN)
    start_local_ray(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray_cfg = RayConfig(retriever_replicas=1, retriever_cpus=0.5, retriever_max_batch=16, http_port=port)
    handle = deploy_retriever(RetrieverConfig(index_dir=str(index_dir)), ray_cfg, name="test_retriever",
                              batch_wait_timeout_s=0.05)
    yield ServeRetrieverClient(handle)
    serve.shutdown()
    stop_ray()
    mp.undo()


def _queries(passages: list[Passage], n: int) -> list[str]:
    return [f"{p.title}: {' '.join(p.text.split()[:6])}" for p in passages[:n]]


def _same(served: list[list[Hit]], expected: list[list[Hit]]) -> None:
    assert [[h.doc_id for h in hs] for hs in served] == [[h.doc_id for h in hs] for hs in expected]
    for hs, es in zip(served, expected, strict=True):
        for h, e in zip(hs, es, strict=True):
            assert (h.title, h.snippet, h.url) == (e.title, e.snippet, e.url)
            assert h.score == pytest.approx(e.score, abs=1e-4)  # batch padding may move the last bits


@ray.remote(num_cpus=0)
class RolloutStandIn:
    """Uses the client from inside a Ray actor, as a rollout actor's env does."""

    def __init__(self, retriever: ServeRetrieverClient):
        self.retriever = retriever

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return self.retriever.search(queries, k)


def test_results_match_in_process_and_get_batched_across_actors(client, local, passages):
    queries = _queries(passages, 24)
    _same(client.search(queries[:8], 5), local.search(queries[:8], 5))
    actors = [RolloutStandIn.remote(client) for _ in range(2)]
    results = ray.get([a.search.remote(queries[8 + 8 * i: 16 + 8 * i], 3) for i, a in enumerate(actors)])
    for i, res in enumerate(results):
        _same(res, local.search(queries[8 + 8 * i: 16 + 8 * i], 3))
    stats = client.stats()
    assert stats["num_docs"] == len(passages)
    assert stats["queries"] >= 24
    assert stats["max_batch"] > 1
    assert stats["batches"] < stats["queries"]


def test_mixed_k_in_one_batch(client, local, passages):
    queries = _queries(passages, 6)
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda ik: client.search([queries[ik[0]]], ik[1])[0], [(i, 1 + i) for i in range(6)]))
    _same(got, [local.search([q], 1 + i)[0] for i, q in enumerate(queries)])


def test_open_and_unknown_id(client, local, passages):
    assert client.open(passages[3].doc_id) == local.open(passages[3].doc_id)
    with pytest.raises(UnknownDocument, match="no-such-doc"):
        client.open("no-such-doc")
    with pytest.raises(KeyError):  # what the env catches
        client.open("")


def test_random_access_for_retrieval_noise(client, local, passages):
    assert len(client) == len(local) == len(passages)
    assert [client.hit_at(r) for r in (0, 7, len(passages) - 1)] == [local.hit_at(r) for r in (0, 7, len(passages) - 1)]


def test_bad_k_and_query_raise_retriever_error(client):
    for k in (0, N_DOCS + 1, MAX_K + 1, 2.5, True):
        with pytest.raises(RetrieverError, match="k must be"):
            client.search(["anything"], k)
    with pytest.raises(ValueError, match="empty"):  # RetrieverError is a ValueError, as the env expects
        client.search(["   "], 3)
    with pytest.raises(RetrieverError, match="list of strings"):
        client.search("not a list", 3)
    assert client.search([], 3) == []


def test_health_check(client):
    assert client.handle.check_health.remote().result() is None
    app = serve.status().applications["test_retriever"]
    assert app.status == "RUNNING"
    assert all(d.status == "HEALTHY" for d in app.deployments.values())


def test_health_check_fails_on_empty_index():
    replica = RetrieverDeployment.func_or_class.__new__(RetrieverDeployment.func_or_class)
    replica._retriever = SimpleNamespace(manifest={"count": 0})
    with pytest.raises(RuntimeError, match="empty"):
        asyncio.run(replica.check_health())


def test_http_route_on_loopback_with_limits(client, port, passages):
    psutil = pytest.importorskip("psutil")
    listening = {c.laddr.ip for c in psutil.net_connections("tcp") if c.laddr.port == port and c.status == "LISTEN"}
    assert listening == {"127.0.0.1"}
    base = f"http://127.0.0.1:{port}/test_retriever"
    assert requests.post(f"{base}/search", json={"queries": ["x"], "k": 1}, timeout=30).status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    deep = requests.post(f"{base}/search", data=b"[" * 100_000 + b"]" * 100_000, headers=auth, timeout=30)
    assert deep.status_code == 400
    assert "nested deeper" in deep.json()["error"]
    ok = requests.post(f"{base}/search", json={"queries": _queries(passages, 2), "k": 2}, headers=auth, timeout=30)
    assert ok.status_code == 200
    assert [len(h) for h in ok.json()["hits"]] == [2, 2]
    long = requests.post(f"{base}/search", json={"queries": ["x" * 1001], "k": 2}, headers=auth, timeout=30)
    assert long.status_code == 400
    assert "limit is 1000" in long.json()["error"]
    big_k = requests.post(f"{base}/search", json={"queries": ["x"], "k": MAX_K + 1}, headers=auth, timeout=30)
    assert big_k.status_code == 400
    assert "k must be" in big_k.json()["error"]
    batch = requests.post(f"{base}/search", json={"queries": ["x"] * 65, "k": 1}, headers=auth, timeout=30)
    assert batch.status_code == 400
    assert requests.post(f"{base}/search", data=b"not json", headers=auth, timeout=30).status_code == 400
    assert requests.post(f"{base}/search", data=b"x" * (1 << 21), headers=auth, timeout=30).status_code == 413
    missing = requests.post(f"{base}/open", json={"doc_id": "no-such-doc"}, headers=auth, timeout=30)
    assert missing.status_code == 404
    assert "no-such-doc" in missing.json()["error"]
    opened = requests.post(f"{base}/open", json={"doc_id": passages[0].doc_id}, headers=auth, timeout=30)
    assert opened.json()["passage"]["text"] == passages[0].text


def _replicas() -> set[str]:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::test_retriever#")}


def test_a_dead_replica_is_replaced_and_search_goes_on(client, local, passages):
    """Serve replaces a replica that dies or fails ``check_health``; callers then reach the new one."""
    (old,) = _replicas()
    ray.kill(ray.get_actor(old, namespace="serve"), no_restart=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        new = _replicas() - {old}
        app = serve.status().applications["test_retriever"]
        if new and all(d.status == "HEALTHY" for d in app.deployments.values()):
            break
        time.sleep(0.5)
    assert new, "Serve started no new replica within 120 s"
    queries = _queries(passages, 4)
    _same(client.search(queries, 3), local.search(queries, 3))
