"""Retrieval at scale: recall@10, queries/s, memory and build cost of FAISS index types, 1 vs 2 shards.

    nice -n 10 .venv/bin/python benchmarks/retrieval_scale.py [--n 1000000] [--quick] [--configs NAME ...]

Data (written once under --work, default ~/.cache/ziprl/bench/retrieval_scale-<n>):
- corpus: the 2000 real passages of the shipped sample (their real MiniLM vectors, read back from the
  shipped flat index) plus n - 2000 synthetic passages of ~300 characters of text each.
- synthetic vectors: a Gaussian mixture in MiniLM's 384-dim space. 4000 centroids: the 2000 real
  passage vectors and 2000 normalised midpoints of random pairs of them, drawn with Zipf-like weights
  (a few large topics, many small ones). Each point is centroid + noise, the noise anisotropic: a
  fixed random rotation of a diagonal Gaussian whose standard deviations fall off as a power law
  (i^-0.5, as sentence-embedding spectra do), scaled per cluster by U(0.7, 1.3) to a mean norm of
  0.9 (cosine to its centroid ~0.75, like topically related MiniLM passages); then L2-normalised.
  Written in chunks to a memory-mapped .npy, so generating never holds all vectors.
- queries: the shipped sample's questions encoded with MiniLM (real queries; the corpus holds their
  real supporting passages) and 500 held-out synthetic points from the same mixture.

Each index is built by ``ziprl.retrieval.index_build.build_index`` from the corpus and the .npy (the
library's path: streamed chunks, training on a sample) in a subprocess whose peak RSS is the build
memory; each is then searched in a fresh subprocess through ``Retriever.search_embeddings`` (FAISS
search + hits read from the memory-mapped passage store): recall@10 against exact search, queries/s
at batch 16 and 64, and resident memory (RSS after load + all searches minus RSS before loading), split into
the process's own memory (RssAnon) and pages of memory-mapped files (RssFile: the page cache of the index's
on-disk vectors, which the kernel can drop and re-read). ``ivf-pq96fs+disk`` is IVF + 4-bit fast-scan PQ in
memory, re-ranked exactly from ``vectors.npy`` on disk (``store_vectors``; the DiskANN trade: memory for
random disk reads of k_factor * k vectors per query).
Goals: one config with recall@10 >= 0.95, >= 3x flat's queries/s and <= 0.2x flat's (own) memory; build
memory bounded by the chunk size. Results: benchmarks/results/retrieval_scale.{json,md,png}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, at_least, in_work_dir, plots_name, write_results  # noqa: E402

from ziprl.outputs import OutputError  # noqa: E402
from ziprl.paths import atomic_path, atomic_write_json  # noqa: E402

DIM, K, CHUNK = 384, 10, 65536
REAL_PASSAGES = 2000  # the shipped sample's passages, the corpus's first rows: --n is at least this
CONFIGS = {  # name: (factory, fraction of IVF lists visited (0 = no IVF), k_factor, exact re-rank from disk)
    "flat": ("Flat", 0, 0, False),
    "hnsw": ("HNSW32", 0, 0, False),
    "ivf-pq48+sq4": ("IVF{nlist},PQ48,Refine(SQ4)", 1 / 32, 8, False),
    "ivf-pq48+sq8": ("IVF{nlist},PQ48,Refine(SQ8)", 1 / 32, 8, False),
    "ivf-pq96fs+disk": ("IVF{nlist},PQ96x4fs", 3 / 4, 16, True),  # 4-bit fast-scan PQ; exact scores from vectors.npy
}
WORDS = ["river", "castle", "museum", "treaty", "season", "album", "village", "station", "battle", "novel", "species", "league", "river", "film", "bridge", "dynasty", "election", "island", "poet", "company"]


def rss_mb(kind: str = "") -> float:
    """Resident memory of this process now, in MiB: all of it, or only ``Anon`` (its own) / ``File`` (mapped files)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(f"Rss{kind}:") or
                    (not kind and line.startswith("VmRSS:"))) / 1024


def peak_mb() -> float:
    """Peak resident memory of this process (VmHWM: unlike ru_maxrss, not inherited from the forking parent)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


# ---------------------------------------------------------------- data


def save_npy(path: Path, array: np.ndarray) -> None:
    """``np.save`` atomically (a killed run leaves no half-written array to be read back)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, array)


def check_data(work: Path, n: int, n_queries: int) -> None:
    """OutputError when ``work`` holds the data of another ``n`` or ``n_queries``, which :func:`make_data` would
    reuse, or a ``data.json`` that does not say which (not written by :func:`make_data`, or damaged)."""
    done = work / "data.json"
    try:
        meta = json.loads(done.read_text(encoding="utf-8")) if done.is_file() else {"n": n, "synthetic_queries": n_queries}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        meta = None
    if not isinstance(meta, dict) or not all(isinstance(meta.get(k), int) for k in ("n", "synthetic_queries")):
        raise OutputError(f"{done} is not the data record this benchmark writes (it needs the integers n and "
                          "synthetic_queries); nothing was written: pass another --work, or delete that directory "
                          "yourself to make the data again")
    if (meta["n"], meta["synthetic_queries"]) != (n, n_queries):
        raise OutputError(f"{work} holds the data of --n {meta['n']} --queries {meta['synthetic_queries']}; pass "
                          "those, or another --work")


def make_data(work: Path, n: int, n_queries: int = 500, seed: int = 0) -> dict:
    """Corpus JSONL + aligned vectors (.npy) + query sets, written once (see the module docstring)."""
    done = work / "data.json"
    if done.is_file():
        return json.loads(done.read_text())
    import faiss

    from ziprl.retrieval.corpus import load_corpus
    from ziprl.retrieval.datasets import SAMPLE_DIR, corpus_for
    from ziprl.retrieval.encoder import Encoder

    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    real = load_corpus(corpus_for("sample"))
    real_x = faiss.read_index(str(SAMPLE_DIR / "index" / "index.faiss")).reconstruct_n(0, len(real))
    pairs = rng.integers(0, len(real), (len(real), 2))
    mids = real_x[pairs[:, 0]] + real_x[pairs[:, 1]]
    centroids = np.concatenate([real_x, mids / np.linalg.norm(mids, axis=1, keepdims=True)]).astype(np.float32)
    weights = 1.0 / np.arange(1, len(centroids) + 1) ** 0.7
    weights = rng.permutation(weights / weights.sum())
    rotation, _ = np.linalg.qr(rng.normal(size=(DIM, DIM)))
    spectrum = np.arange(1, DIM + 1) ** -0.5
    spectrum *= 0.9 / np.sqrt((spectrum ** 2).sum())  # expected noise norm 0.9
    scale = rng.uniform(0.7, 1.3, len(centroids))

    def sample(m: int) -> np.ndarray:
        c = rng.choice(len(centroids), m, p=weights)
        noise = (rng.normal(size=(m, DIM)) * spectrum) @ rotation.T * scale[c, None]
        x = (centroids[c] + noise).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    vecs = np.lib.format.open_memmap(work / "vectors.npy", "w+", np.float32, (n, DIM))
    vecs[:len(real)] = real_x
    with open(work / "corpus.jsonl", "w", encoding="utf-8") as f:
        for p in real:
            f.write(json.dumps({"id": p.doc_id, "title": p.title, "text": p.text}, ensure_ascii=False) + "\n")
        for start in range(len(real), n, CHUNK):
            stop = min(n, start + CHUNK)
            vecs[start:stop] = sample(stop - start)
            for i in range(start, stop):
                words = " ".join(WORDS[j] for j in rng.integers(0, len(WORDS), 45))
                f.write(json.dumps({"id": f"syn-{i}", "title": f"Synthetic {i}", "text": words}) + "\n")
    vecs.flush()
    del vecs
    questions = [json.loads(line)["question"] for line in (SAMPLE_DIR / "qa.jsonl").read_text().splitlines()]
    save_npy(work / "queries_real.npy", Encoder().encode_queries(questions[:n_queries]))
    save_npy(work / "queries_synthetic.npy", sample(n_queries))
    meta = {"n": n, "dim": DIM, "real_passages": len(real), "centroids": len(centroids),
            "real_queries": min(n_queries, len(questions)), "synthetic_queries": n_queries}
    atomic_write_json(done, meta)
    return meta


def exact_topk(work: Path, queries: np.ndarray, k: int = K) -> np.ndarray:
    """Exact top-k row ids by inner product, streaming the base vectors in chunks (cached)."""
    import faiss

    cache = work / f"truth-{hashlib.sha256(queries.tobytes()).hexdigest()[:12]}.npy"
    if cache.is_file():
        return np.load(cache)
    x = np.load(work / "vectors.npy", mmap_mode="r")
    heap = faiss.ResultHeap(len(queries), k, keep_max=True)
    for start in range(0, len(x), CHUNK):
        block = np.ascontiguousarray(x[start:start + CHUNK])
        d, i = faiss.knn(queries, block, k, metric=faiss.METRIC_INNER_PRODUCT)
        heap.add_result(d, np.where(i >= 0, i + start, -1))
    heap.finalize()
    save_npy(cache, heap.I)
    return heap.I


# ---------------------------------------------------------------- subprocess workers


def worker_build(work: Path, name: str, factory: str, shards: int, train_size: int, store_vectors: bool) -> dict:
    from ziprl.retrieval.encoder import Encoder
    from ziprl.retrieval.index_build import build_index

    class Dim384(Encoder):  # the query encoder's identity without loading it (its dim is known: 384)
        dim = DIM

    t0 = time.perf_counter()
    build_index(work / "corpus.jsonl", work / f"idx-{name}-{shards}", Dim384(), factory, progress=False, shards=shards,
                chunk_size=CHUNK, train_size=train_size, embeddings=work / "vectors.npy", checkpoint_s=1e9,
                store_vectors=store_vectors)
    return {"build_s": time.perf_counter() - t0, "build_peak_mb": peak_mb()}


def worker_search(work: Path, name: str, shards: int, nprobe: int, k_factor: int) -> dict:
    import faiss

    from ziprl.retrieval.retriever import Retriever

    faiss.omp_set_num_threads(1)  # one search thread: comparable on a shared box (a replica per core)
    queries = {s: np.load(work / f"queries_{s}.npy") for s in ("real", "synthetic")}
    truth = {s: exact_topk(work, q) for s, q in queries.items()}
    before, anon, mapped = rss_mb(), rss_mb("Anon"), rss_mb("File")
    r = Retriever.load(work / f"idx-{name}-{shards}", nprobe=nprobe, k_factor=k_factor, ef_search=128)
    loaded = rss_mb()
    out: dict = {}
    for s, q in queries.items():
        got = [[_row(h.doc_id, work) for h in hs] for hs in r.search_embeddings(q, K)]
        out[f"recall@10_{s}"] = float(np.mean([len(set(g) & set(t)) / K for g, t in zip(got, truth[s], strict=True)]))
    both = np.concatenate(list(queries.values()))
    for batch in (16, 64):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 3.0 or n < 2 * batch:
            start = (n // batch * batch) % max(1, len(both) - batch)
            r.search_embeddings(both[start:start + batch], K)
            n += batch
        out[f"qps_b{batch}"] = n / (time.perf_counter() - t0)
    out.update({"load_mb": loaded - before, "resident_mb": rss_mb() - before, "own_mb": rss_mb("Anon") - anon,
                "mapped_mb": rss_mb("File") - mapped})
    files = [p for p in (work / f"idx-{name}-{shards}").rglob("*") if p.is_file()]
    out["index_file_mb"] = sum(p.stat().st_size for p in files if p.name.startswith("index")) / 2**20
    out["vectors_file_mb"] = sum(p.stat().st_size for p in files if p.name == "vectors.npy") / 2**20
    out["passages_file_mb"] = sum(p.stat().st_size for p in files if p.name == "passages.arrow") / 2**20
    return out


_REAL_ROWS: dict[str, int] = {}


def _row(doc_id: str, work: Path) -> int:
    """Corpus row of a doc id: synthetic ids carry it; the 2000 real ones are rows 0..1999."""
    if doc_id.startswith("syn-"):
        return int(doc_id[4:])
    if not _REAL_ROWS:
        with open(work / "corpus.jsonl", encoding="utf-8") as f:
            for i, line in enumerate(f):
                rec = json.loads(line)
                if rec["id"].startswith("syn-"):
                    break
                _REAL_ROWS[rec["id"]] = i
    return _REAL_ROWS[doc_id]


def run_worker(kind: str, *args) -> dict:
    """Run a worker in a fresh process (own memory accounting); returns its JSON result."""
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import retrieval_scale as b; "
            f"from pathlib import Path; print('RESULT' + json.dumps(b.worker_{kind}(Path({str(args[0])!r}), "
            f"*{args[1:]!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")]
    if proc.returncode or not line:
        raise RuntimeError(f"{kind} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[-1][6:])


# ---------------------------------------------------------------- report


BIG_N, BIG_D = 21_000_000, 768


def query_cost(config: str, n: int, d: int, k_factor: int, frac: float) -> float:
    """Relative work per query: flat n*d; HNSW log2(n)*d; IVF-PQ the coarse search (nlist*d) + the scanned
    codes (frac = nprobe/nlist of n codes of d/8 bytes) + re-ranking (k_factor*k*d)."""
    if config == "flat":
        return n * d
    if config == "hnsw":
        return np.log2(n) * d
    return nlist_for(n) * d + frac * n * d / 8 + k_factor * K * d


def extrapolate(rows: list[dict], n: int) -> list[dict]:
    """Memory and queries/s at wiki-18 scale (21M x 768) from the 1-shard measurements: index bytes per vector
    (the file; loading it costs as much RAM, see load_mb) x 21M x 768/384 (every part of these indexes grows
    with the dimension, ids and HNSW links aside; passages stay on disk); queries/s
    x the ratio of :func:`query_cost` here to there (one search thread, as measured)."""
    out = []
    for r in rows:
        if r["shards"] != 1:
            continue
        mem_gb = r["index_file_mb"] * 2**20 / n * BIG_N * (BIG_D / DIM) / 2**30
        frac = r["nprobe"] / nlist_for(n)  # the same fraction of lists visited at 21M
        ratio = (query_cost(r["config"], n, DIM, r["k_factor"], frac)
                 / query_cost(r["config"], BIG_N, BIG_D, r["k_factor"], frac))
        out.append({"config": r["config"], "nprobe_at_21M": round(frac * nlist_for(BIG_N)), "factory_at_21M": r["factory"].replace(f"IVF{nlist_for(n)}",
                                                                                    f"IVF{nlist_for(BIG_N)}"),
                    "memory_gb_21Mx768": round(mem_gb, 1), "qps_b64_per_thread_21Mx768": round(r["qps_b64"] * ratio, 2),
                    "disk_vectors_gb_21Mx768": round(r.get("vectors_file_mb", 0) * 2**20 / n * BIG_N * 2 / 2**30, 1)})
    return out


def nlist_for(n: int) -> int:
    """IVF lists: ~sqrt(n), a power of two (100k -> 256, 1M -> 1024, 21M -> 4096)."""
    return int(2 ** round(np.log2(np.sqrt(n))))


def plot(rows: list[dict], path: Path) -> None:
    from ziprl.plots import _plt, save_figure

    fig, ax = _plt().subplots(figsize=(6.5, 4.2))
    for r in rows:
        ax.scatter(r["load_mb"], r["qps_b64"], s=30)
        ax.annotate(f"{r['config']} x{r['shards']}" + (f" np{r['nprobe']}" if r["nprobe"] else "")
                    + f" R@10 {r['recall@10_real']:.2f}/{r['recall@10_synthetic']:.2f}",
                    (r["load_mb"], r["qps_b64"]), fontsize=6, xytext=(4, 2), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("index memory after load (MiB)")
    ax.set_ylabel("queries/s at batch 64 (1 thread)")
    ax.set_title(f"{rows[0]['n']:,} x {DIM} vectors: memory vs speed")
    fig.tight_layout()
    save_figure(fig, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, checked (exit 2) before anything is written: ``n`` and ``work`` filled in."""
    from ziprl.paths import cache_root

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="corpus vectors")
    ap.add_argument("--quick", action="store_true", help="n = 100000 (a smoke run)")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--sharded", nargs="+", default=["flat", "ivf-pq48+sq4"], choices=[*CONFIGS, "none"],
                    help="configs also built as 2 shards ('none': no config)")
    ap.add_argument("--work", default=None, help="data + index directory")
    ap.add_argument("--name", type=plots_name(), default="retrieval_scale", help="results file name under benchmarks/results/")
    ap.add_argument("--queries", type=int, default=500, help="queries of each kind (real, synthetic)")
    ap.add_argument("--sweep", nargs="*", type=at_least(1), default=None, metavar="NPROBE",
                    help="search the IVF indexes of the last run again at these nprobe values and add the rows")
    args = ap.parse_args(argv)
    args.n = 100_000 if args.quick else args.n
    if args.n < REAL_PASSAGES:
        ap.error(f"--n {args.n}: the corpus holds the sample's {REAL_PASSAGES} real passages, so --n is at least "
                 f"{REAL_PASSAGES}")
    if args.queries < 1:
        ap.error(f"--queries {args.queries}: give at least 1")
    if args.sweep is not None and not (RESULTS / f"{args.name}.json").is_file():
        ap.error(f"--sweep searches the indexes of the last run, whose results {RESULTS / args.name}.json are "
                 "missing: run without --sweep first")
    args.work = args.work or str(cache_root() / "bench" / f"retrieval_scale-{args.n}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # data and indexes go into a directory this benchmark marked; a rerun reuses the data of the same --n and --queries
    return in_work_dir(args.work, lambda work: run(args, work), "--work: ",
                       check=lambda work: check_data(work, args.n, args.queries), kind="bench-retrieval_scale")


def run(args: argparse.Namespace, work: Path) -> None:
    """The data, then each config's build and search, then the results files."""
    n, t0 = args.n, time.perf_counter()
    meta = make_data(work, n, args.queries)
    print(f"data ready in {time.perf_counter() - t0:.0f} s: {work}", flush=True)
    nlist = nlist_for(n)
    train = min(n, 64 * nlist)
    rows = []
    if args.sweep is not None:  # search-only rows at other nprobe values, on the indexes built by the last run
        last = json.loads((RESULTS / f"{args.name}.json").read_text())
        rows = [r for r in last["rows"] if r["build_s"] is not None]  # the built rows, not earlier sweeps
        for r in [r for r in rows if r["nprobe"] and r["shards"] == 1]:
            for nprobe in args.sweep:
                print(f"{r['config']} nprobe {nprobe}", flush=True)
                rows.append({**r, "nprobe": nprobe, "build_s": None, "build_peak_mb": None,
                             **run_worker("search", work, r["config"], 1, nprobe, r["k_factor"])})
        args.configs = []
    for name in args.configs:
        factory, lists, k_factor, store_vectors = CONFIGS[name]
        factory, nprobe = factory.format(nlist=nlist), max(8, round(nlist * lists)) if lists else 0
        for shards in (1, 2) if name in args.sharded else (1,):
            print(f"{name} x{shards}: building {factory}", flush=True)
            row = {"config": name, "factory": factory, "shards": shards, "n": n, "nprobe": nprobe, "k_factor": k_factor}
            row.update(run_worker("build", work, name, factory, shards, train, store_vectors))
            row.update(run_worker("search", work, name, shards, nprobe, k_factor))
            print(json.dumps(row), flush=True)
            rows.append(row)
    flat = next((r for r in rows if r["config"] == "flat" and r["shards"] == 1), None)
    for r in rows:
        if flat is not None:
            r["qps_vs_flat"] = r["qps_b64"] / flat["qps_b64"]
            r["memory_vs_flat"] = r["load_mb"] / flat["load_mb"]
            r["resident_vs_flat"] = r["resident_mb"] / flat["resident_mb"]
            r["own_vs_flat"] = r.get("own_mb", r["resident_mb"]) / flat.get("own_mb", flat["resident_mb"])
            r["meets_goal"] = (r["recall@10_synthetic"] >= 0.95 and r["recall@10_real"] >= 0.95
                               and r["qps_vs_flat"] >= 3 and r["own_vs_flat"] <= 0.2)
    meta.update({"chunk_size": CHUNK, "chunk_mb": CHUNK * DIM * 4 / 2**20, "nlist": nlist, "train_size": train,
                 "search_threads": 1, "extrapolated": extrapolate(rows, n),
                 "goal": "recall@10 >= 0.95, >= 3x flat qps, <= 0.2x flat memory"})
    write_results(args.name, rows, meta)
    plot(rows, RESULTS / f"{args.name}.png")
    print(json.dumps(meta["extrapolated"], indent=1))


if __name__ == "__main__":
    sys.exit(main())
