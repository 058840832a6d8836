"""The FAISS retriever as a Ray Serve deployment, and a client that rollout actors use as a RetrieverLike.

Each replica loads the index once. Every query of every ``search`` request joins one batch queue
(``@serve.batch``), so queries from many rollout actors share one encoder forward pass and one
FAISS search; a request with many queries costs one RPC, not one per query. The blocking encoder +
FAISS work runs on one worker thread per replica, never on the replica's event loop. Rollout actors reach it through a :class:`DeploymentHandle` (no HTTP);
an HTTP route is added only when ``RayConfig.http_port`` is set, bound to ``RayConfig.http_host``:

    POST /retriever/search  {"queries": ["..."], "k": 5}  -> {"hits": [[{doc_id, title, snippet, score, url}]]}
    POST /retriever/open    {"doc_id": "..."}             -> {"passage": {doc_id, title, text, url}}  (404 if unknown)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse

from ziprl.config import RayConfig, RetrieverConfig, _from_dict
from ziprl.env.retriever import Retriever, RetrieverError, UnknownDocument
from ziprl.env.types import Hit, Passage

MAX_K = 100
MAX_QUERY_CHARS = 1000  # HTTP only; in-cluster callers are trusted
MAX_HTTP_BATCH = 64
MAX_HTTP_BODY = 1 << 20
HEALTH_QUERY = "health check"


def search_error(query: Any, k: Any, num_docs: int, max_chars: int | None = None) -> str | None:
    """Why a one-query search request is invalid (as the in-process Retriever would judge it), or None."""
    if not isinstance(query, str) or not query.strip():
        return f"the query is empty or not a string ({str(query)[:50]!r}); every query needs some text"
    if max_chars is not None and len(query) > max_chars:
        return f"the query is {len(query)} characters; the limit is {max_chars}"
    limit = min(MAX_K, num_docs)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= limit:
        return f"k must be an integer in 1..{limit}, got {k!r}"
    return None


@serve.deployment
class RetrieverDeployment:
    """One replica = one loaded index. Handle methods: ``search(queries, k)``, ``open(doc_id)``, ``hit_at(row)``, ``stats()``."""

    def __init__(self, retriever: RetrieverConfig | dict, max_batch_size: int = 32, batch_wait_timeout_s: float = 0.01):
        cfg = _from_dict(RetrieverConfig, retriever) if isinstance(retriever, dict) else retriever
        self._retriever = Retriever.from_config(cfg)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever")
        self._search_batch.set_max_batch_size(max_batch_size)
        self._search_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)
        self._batches = self._queries = self._max_batch = 0
        self._busy_s = 0.0

    async def _blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)
    async def _search_batch(self, queries: list[str], ks: list[int]) -> list[list[Hit]]:
        self._batches += 1
        self._queries += len(queries)
        self._max_batch = max(self._max_batch, len(queries))
        start = time.perf_counter()
        hits = await self._blocking(self._retriever.search, queries, max(ks))  # one search at the largest k
        self._busy_s += time.perf_counter() - start
        return [h[:k] for h, k in zip(hits, ks, strict=True)]

    async def search(self, queries: list[str], k: int, max_chars: int | None = None) -> list[list[Hit]] | dict[str, str]:
        """Top-k hits per query, or ``{"error": ...}`` (first bad query or k) with nothing searched.

        Each query is queued on its own, so it is batched with concurrent requests' queries.
        """
        if isinstance(queries, str) or not isinstance(queries, Sequence):
            return {"error": f"queries must be a list of strings, got {type(queries).__name__}"}
        for q in queries:
            if (err := search_error(q, k, len(self._retriever), max_chars)) is not None:
                return {"error": err}
        return list(await asyncio.gather(*(self._search_batch(q, k) for q in queries)))

    async def open(self, doc_id: str) -> Passage | dict[str, str]:
        """The passage, or ``{"error": ...}`` for an unknown id."""
        try:
            return await self._blocking(self._retriever.open, doc_id)
        except KeyError as exc:
            return {"error": str(exc)}

    def hit_at(self, row: int) -> Hit:
        """Passage ``row`` as a search hit (env.retrieval_noise); ``num_docs`` from :meth:`stats` bounds it."""
        return self._retriever.hit_at(row)

    def stats(self) -> dict[str, float]:
        """Counters of this replica: batches, queries, largest batch, seconds in search, index size."""
        return {"batches": self._batches, "queries": self._queries, "max_batch": self._max_batch,
                "search_s": self._busy_s, "num_docs": len(self._retriever)}

    async def check_health(self) -> None:
        """Raise unless the index is loaded and a one-hit search works (Serve then replaces the replica)."""
        if len(self._retriever) == 0:
            raise RuntimeError("retriever index is empty")
        hits = await self._blocking(self._retriever.search, [HEALTH_QUERY], 1)
        if len(hits) != 1 or len(hits[0]) != 1:
            raise RuntimeError(f"health search returned {hits!r}")

    async def __call__(self, request: Request) -> JSONResponse:
        """HTTP: POST .../search or .../open with a JSON body; 400 with a message on bad input."""
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_HTTP_BODY:
                return _error(413, f"body larger than {MAX_HTTP_BODY} bytes")
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "body must be JSON")
        if not isinstance(body, dict):
            return _error(400, "body must be a JSON object")
        route = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        if route == "search":
            queries = body.get("queries")
            if not isinstance(queries, list) or not 1 <= len(queries) <= MAX_HTTP_BATCH:
                return _error(400, f"'queries' must be a list of 1..{MAX_HTTP_BATCH} strings")
            hits = await self.search(queries, body.get("k", 5), MAX_QUERY_CHARS)
            if isinstance(hits, dict):
                return _error(400, hits["error"])
            return JSONResponse({"hits": [[dataclasses.asdict(h) for h in hs] for hs in hits]})
        if route == "open":
            doc_id = body.get("doc_id")
            if not isinstance(doc_id, str) or len(doc_id) > MAX_QUERY_CHARS:
                return _error(400, f"'doc_id' must be a string of at most {MAX_QUERY_CHARS} characters")
            p = await self.open(doc_id)
            return _error(404, p["error"]) if isinstance(p, dict) else JSONResponse({"passage": dataclasses.asdict(p)})
        return _error(404, "unknown route; POST <prefix>/search or <prefix>/open")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def deploy_retriever(
    cfg: RetrieverConfig,
    ray_cfg: RayConfig,
    name: str = "retriever",
    batch_wait_timeout_s: float = 0.01,
) -> DeploymentHandle:
    """Run the retriever app on the connected Ray cluster and return its handle (waits until healthy).

    Replicas, CPUs per replica and max batch come from ``ray_cfg`` (Ray gives a replica
    ``max(1, floor(retriever_cpus))`` encoder threads); the HTTP route ``/<name>`` is served on
    ``ray_cfg.http_host:http_port`` only when ``http_port`` is set (no proxy otherwise).
    """
    if ray_cfg.http_port is None:
        serve.start(proxy_location="Disabled")
    else:
        serve.start(proxy_location="HeadOnly", http_options={"host": ray_cfg.http_host, "port": ray_cfg.http_port})
    batch = ray_cfg.retriever_max_batch
    app = RetrieverDeployment.options(
        name=name,
        num_replicas=ray_cfg.retriever_replicas,
        ray_actor_options={"num_cpus": ray_cfg.retriever_cpus},
        max_ongoing_requests=2 * batch,  # >= max batch, so one batch fills while the previous one runs
        logging_config={"enable_access_log": False},  # one line per search would flood the driver log
    ).bind(dataclasses.asdict(cfg), batch, batch_wait_timeout_s)
    route = f"/{name}" if ray_cfg.http_port is not None else None
    return serve.run(app, name=name, route_prefix=route)


class ServeRetrieverClient:
    """RetrieverLike over a DeploymentHandle; picklable, so it can be passed into rollout actors.

    Raises what the in-process Retriever raises: RetrieverError (a ValueError) for a bad query or k,
    UnknownDocument (a KeyError) from ``open``, so the env turns both into observations.
    """

    def __init__(self, handle: DeploymentHandle):
        self.handle = handle
        self._num_passages: int | None = None

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-k hits per query: one request; the replica batches its queries with other actors'."""
        hits = self.handle.search.remote(queries, k).result()
        if isinstance(hits, dict):
            raise RetrieverError(hits["error"])
        return hits

    def open(self, doc_id: str) -> Passage:
        """The full passage; UnknownDocument for an id that is not in the index."""
        p = self.handle.open.remote(doc_id).result()
        if isinstance(p, dict):
            raise UnknownDocument(p["error"])
        return p

    def num_passages(self) -> int:
        if self._num_passages is None:
            self._num_passages = int(self.stats()["num_docs"])
        return self._num_passages

    def hit_at(self, row: int) -> Hit:
        return self.handle.hit_at.remote(row).result()

    def stats(self) -> dict[str, float]:
        """Counters of the replica that answers this call (see RetrieverDeployment.stats)."""
        return self.handle.stats.remote().result()
