"""The FAISS retriever as a Ray Serve deployment, and a client that rollout actors use as a RetrieverLike.

Each replica loads the index once. Every query of every ``search`` request joins one batch queue
(``@serve.batch``), so queries from many rollout actors share one encoder forward pass and one
FAISS search; a request with many queries costs one RPC, not one per query. The blocking encoder +
FAISS work runs on one worker thread per replica, never on the replica's event loop. Rollout actors reach it through a :class:`DeploymentHandle` (no HTTP);
an HTTP route is added only when ``RayConfig.http_port`` is set, bound to ``RayConfig.http_host``.

A sharded index (``manifest.json`` with ``shards`` > 1) runs as one :class:`RetrieverShard` deployment per
shard (``ray.retriever_replicas`` replicas each) behind the :class:`RetrieverDeployment` router, which
encodes each batch once, fans the vectors out to every shard and merges the top-k by score.
Back-pressure: each caller queues at most ``ray.retriever_max_queued`` requests; beyond that Serve
refuses at once, and :class:`ServeRetrieverClient` waits and retries (also when a replica dies) until
``ray.retriever_timeout_s``, then raises :class:`RetrieverUnavailable`; no query is dropped silently.

    POST /retriever/search  {"queries": ["..."], "k": 5}  -> {"hits": [[{doc_id, title, snippet, score, url}]]}
    POST /retriever/open    {"doc_id": "..."}             -> {"passage": {doc_id, title, text, url}}  (404 if unknown)

When ``$ZIPRL_HTTP_TOKEN`` is set, every HTTP request needs ``Authorization: Bearer <token>`` (401 otherwise);
binding beyond loopback (``ray.http_host`` not 127.0.0.1/localhost/::1) warns and requires the token. Bodies are
limited in size (413) and JSON nesting depth (400), so no request can raise inside the replica.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import os
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse

from ziprl.config import HTTP_TOKEN_ENV, LOOPBACK, ConfigError, RayConfig, RetrieverConfig, from_dict
from ziprl.retrieval.index_files import read_manifest
from ziprl.retrieval.retriever import Retriever, RetrieverError, UnknownDocument, merge_hits
from ziprl.retrieval.types import Hit, Passage

# worth retrying: a full queue, a replica that died or is being replaced, a call that ran out of time
RETRYABLE = (BackPressureError, DeploymentUnavailableError, RayActorError, ActorDiedError, ActorUnavailableError,
             TimeoutError)

MAX_K = 100
MAX_QUERY_CHARS = 1000  # HTTP only; in-cluster callers are trusted
MAX_HTTP_BATCH = 64
MAX_HTTP_BODY = 1 << 20
MAX_JSON_DEPTH = 8  # a search body is 3 levels deep
_JSON_STRING_RE = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
log = logging.getLogger(__name__)


def json_depth(raw: bytes) -> int:
    """Deepest nesting of arrays/objects in a JSON text (brackets inside strings ignored); no recursion."""
    depth = deepest = 0
    for b in _JSON_STRING_RE.sub(b"", raw).translate(None, _NOT_BRACKETS):
        depth += 1 if b in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def parse_body(raw: bytes) -> dict | str:
    """The JSON object of a request body, or why it is not one (too deep, not JSON, not an object)."""
    if json_depth(raw) > MAX_JSON_DEPTH:
        return f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return "body must be JSON"
    return body if isinstance(body, dict) else "body must be a JSON object"


def authorized(header: str | None, token: str | None) -> bool:
    """True when no token is required, or the Authorization header carries it (constant-time compare)."""
    return token is None or hmac.compare_digest((header or "").encode(), f"Bearer {token}".encode())
HEALTH_QUERY = "health check"


def search_error(query: Any, k: Any, passages: int, max_chars: int | None = None) -> str | None:
    """Why a one-query search request is invalid (as the in-process Retriever would judge it), or None."""
    if not isinstance(query, str) or not query.strip():
        return f"the query is empty or not a string ({str(query)[:50]!r}); every query needs some text"
    if max_chars is not None and len(query) > max_chars:
        return f"the query is {len(query)} characters; the limit is {max_chars}"
    limit = min(MAX_K, passages)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= limit:
        return f"k must be an integer in 1..{limit}, got {k!r}"
    return None


def _config(retriever: RetrieverConfig | dict) -> RetrieverConfig:
    return from_dict(RetrieverConfig, retriever) if isinstance(retriever, dict) else retriever


@serve.deployment
class RetrieverShard:
    """One replica = one shard of a sharded index. Handle methods: ``search_embeddings``, ``open``, ``hit_at``,
    ``__len__`` (the shard's passages)."""

    def __init__(self, retriever: RetrieverConfig | dict, shard: int):
        self._retriever = Retriever.from_config(_config(retriever), shards=[shard])
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever-shard")

    async def search_embeddings(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """This shard's top-k (fewer when the shard is smaller) for each query vector."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._retriever.search_embeddings, vectors, k)

    def open(self, doc_id: str) -> Passage | None:
        """The passage when this shard holds the id, else None."""
        try:
            return self._retriever.open(doc_id)
        except KeyError:
            return None

    def __len__(self) -> int:
        return len(self._retriever)

    def hit_at(self, row: int) -> Hit:
        return self._retriever.hit_at(row)

    def check_health(self) -> None:
        if len(self._retriever) == 0:
            raise RuntimeError("retriever shard is empty")


@serve.deployment
class RetrieverDeployment:
    """One replica = one loaded index, or the router of a sharded one (``shards``: a handle per shard).

    Handle methods: ``search(queries, k)``, ``open(doc_id)``, ``hit_at(row)``, ``__len__()``, ``stats()``.
    """

    def __init__(self, retriever: RetrieverConfig | dict, max_batch_size: int = 32, batch_wait_timeout_s: float = 0.01,
                 shards: list[DeploymentHandle] | None = None, http_token: str | None = None):
        self._shards = shards or []
        self._sizes: list[int] | None = None  # passages per shard (a router's hit_at), asked once
        self._http_token = http_token
        # a router loads the manifest and encoder only (shards=[]); the shard deployments hold the indexes
        self._retriever = Retriever.from_config(_config(retriever), shards=[] if self._shards else None)
        self._retriever.encode_queries([HEALTH_QUERY])  # load the encoder now (healthy = ready), not on a first query
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
        hits = await self._search(queries, max(ks))  # one search at the largest k
        self._busy_s += time.perf_counter() - start
        return [h[:k] for h, k in zip(hits, ks, strict=True)]

    async def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not self._shards:
            return await self._blocking(self._retriever.search, queries, k)
        vectors = await self._blocking(self._retriever.encode_queries, queries)
        return merge_hits(await asyncio.gather(*(h.search_embeddings.remote(vectors, k) for h in self._shards)), k)

    async def search(self, queries: list[str], k: int, max_chars: int | None = None) -> list[list[Hit]] | dict[str, str]:
        """Top-k hits per query, or ``{"error": ...}`` (first bad query or k) with nothing searched.

        Each query is queued on its own, so it is batched with concurrent requests' queries.
        """
        if isinstance(queries, str) or not isinstance(queries, Sequence):
            return {"error": f"queries must be a list of strings, got {type(queries).__name__}"}
        for q in queries:
            if (err := search_error(q, k, len(self), max_chars)) is not None:
                return {"error": err}
        return list(await asyncio.gather(*(self._search_batch(q, k) for q in queries)))

    async def open(self, doc_id: str) -> Passage | dict[str, str]:
        """The passage, or ``{"error": ...}`` for an unknown id."""
        try:
            if not self._shards:
                return await self._blocking(self._retriever.open, doc_id)
            found = [p for p in await asyncio.gather(*(h.open.remote(doc_id) for h in self._shards)) if p is not None]
            if found:
                return found[0]
            self._retriever.open(doc_id)  # raises UnknownDocument with the usual message
        except KeyError as exc:
            return {"error": str(exc)}

    async def hit_at(self, row: int) -> Hit:
        """Passage ``row`` (0..len(self)-1) as a search hit (env.retrieval_noise).

        A router asks the shard holding the row (shards are contiguous slices of the corpus, in order).
        """
        if not self._shards:
            return self._retriever.hit_at(row)
        if self._sizes is None:
            self._sizes = list(await asyncio.gather(*(h.__len__.remote() for h in self._shards)))
        for handle, size in zip(self._shards, self._sizes, strict=True):
            if row < size:
                return await handle.hit_at.remote(row)
            row -= size
        raise IndexError("passage row out of range")

    def __len__(self) -> int:
        """Passages in the whole index (a router loads none itself: its shards hold them)."""
        return int(self._retriever.manifest["count"])

    def stats(self) -> dict[str, float]:
        """Counters of this replica: batches, queries, largest batch, seconds in search, index size."""
        return {"batches": self._batches, "queries": self._queries, "max_batch": self._max_batch,
                "search_s": self._busy_s, "num_docs": len(self), "shards": max(1, len(self._shards))}

    async def check_health(self) -> None:
        """Raise unless the index is loaded and a one-hit search works (Serve then replaces the replica)."""
        if len(self) == 0:
            raise RuntimeError("retriever index is empty")
        hits = await self._search([HEALTH_QUERY], 1)
        if len(hits) != 1 or len(hits[0]) != 1:
            raise RuntimeError(f"health search returned {hits!r}")

    async def __call__(self, request: Request) -> JSONResponse:
        """HTTP: POST .../search or .../open with a JSON body; 400 with a message on bad input."""
        if not authorized(request.headers.get("authorization"), self._http_token):
            return _error(401, "missing or wrong 'Authorization: Bearer <token>' header")
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_HTTP_BODY:
                return _error(413, f"body larger than {MAX_HTTP_BODY} bytes")
        body = parse_body(raw)
        if isinstance(body, str):
            return _error(400, body)
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
    ``ray_cfg.http_host:http_port`` only when ``http_port`` is set (no proxy otherwise). An index with
    N > 1 shards gets deployments ``<name>_shard<i>`` (``retriever_replicas`` replicas each) and a router.
    """
    token = os.environ.get(HTTP_TOKEN_ENV) or None
    if ray_cfg.http_port is None:
        serve.start(proxy_location="Disabled")
    else:
        if ray_cfg.http_host not in LOOPBACK:
            if token is None:
                raise ConfigError(f"ray.http_host={ray_cfg.http_host} exposes the retriever beyond this machine: set "
                                  f"{HTTP_TOKEN_ENV} to a secret token (clients send 'Authorization: Bearer <token>')")
            log.warning("the retriever's HTTP route listens on %s:%s, reachable from other machines; it requires "
                        "the %s bearer token", ray_cfg.http_host, ray_cfg.http_port, HTTP_TOKEN_ENV)
        serve.start(proxy_location="HeadOnly", http_options={"host": ray_cfg.http_host, "port": ray_cfg.http_port})
    batch = ray_cfg.retriever_max_batch
    options = {
        "num_replicas": ray_cfg.retriever_replicas,
        "ray_actor_options": {"num_cpus": ray_cfg.retriever_cpus},
        "max_ongoing_requests": 2 * batch,  # >= max batch, so one batch fills while the previous one runs
        "max_queued_requests": ray_cfg.retriever_max_queued,  # beyond: BackPressureError at once (client retries)
        "logging_config": {"enable_access_log": False},  # one line per search would flood the driver log
    }
    cfg_dict = dataclasses.asdict(cfg)
    manifest = read_manifest(Path(cfg.index_dir).expanduser()) if cfg.index_dir and not cfg.corpus else None
    n_shards = int((manifest or {}).get("shards", 1))
    shards = [RetrieverShard.options(name=f"{name}_shard{i}", **options).bind(cfg_dict, i)
              for i in range(n_shards)] if n_shards > 1 else None
    app = RetrieverDeployment.options(name=name, **options).bind(cfg_dict, batch, batch_wait_timeout_s, shards, token)
    route = f"/{name}" if ray_cfg.http_port is not None else None
    return serve.run(app, name=name, route_prefix=route)


class RetrieverUnavailable(RuntimeError):
    """The retriever did not answer within ``ray.retriever_timeout_s`` (overloaded or down)."""


class ServeRetrieverClient:
    """RetrieverLike over a DeploymentHandle; picklable, so it can be passed into rollout actors.

    Raises what the in-process Retriever raises: RetrieverError (a ValueError) for a bad query or k,
    UnknownDocument (a KeyError) from ``open``, so the env turns both into observations. A full queue,
    a dead replica or a slow answer is retried (reads are idempotent) with backoff until ``timeout_s``,
    then :class:`RetrieverUnavailable` is raised: an infrastructure failure, not an observation.
    """

    def __init__(self, handle: DeploymentHandle, timeout_s: float = 60.0):
        self.handle, self.timeout_s = handle, timeout_s
        self.retries = 0  # calls retried by this client (back-pressure, dead replicas, time-outs)
        self._len: int | None = None  # the index's passages, asked once

    def _call(self, method: str, *args: Any) -> Any:
        deadline, delay = time.monotonic() + self.timeout_s, 0.02
        while True:
            try:
                return getattr(self.handle, method).remote(*args).result(timeout_s=max(0.01, deadline - time.monotonic()))
            except RETRYABLE as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RetrieverUnavailable(
                        f"the retriever did not answer {method} within {self.timeout_s:g} s (last: "
                        f"{type(exc).__name__}); add replicas (ray.retriever_replicas) or raise "
                        "ray.retriever_timeout_s") from exc
                self.retries += 1
                time.sleep(min(delay, left))
                delay = min(2 * delay, 1.0)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-k hits per query: one request; the replica batches its queries with other actors'."""
        hits = self._call("search", queries, k)
        if isinstance(hits, dict):
            raise RetrieverError(hits["error"])
        return hits

    def open(self, doc_id: str) -> Passage:
        """The full passage; UnknownDocument for an id that is not in the index."""
        p = self._call("open", doc_id)
        if isinstance(p, dict):
            raise UnknownDocument(p["error"])
        return p

    def __len__(self) -> int:
        """Passages in the index (env.retrieval_noise's rows; the env checks env.top_k against it)."""
        if self._len is None:
            self._len = int(self._call("__len__"))
        return self._len

    def hit_at(self, row: int) -> Hit:
        return self._call("hit_at", row)

    def stats(self) -> dict[str, float]:
        """Counters of the replica that answers this call (see RetrieverDeployment.stats)."""
        return self._call("stats")
