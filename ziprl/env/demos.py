"""Cold-start demonstrations: the scripted teacher plays episodes through the real retriever.

The teacher searches each supporting title, opens the matching passage, writes an extractive note at a
level chosen by relevance to the question (more supporting content -> finer level) and answers gold.
As in the paper, only correct, well-formed trajectories are kept; the file holds one row per transition
(``messages`` as JSON, ``response``) for transition-level SFT (:mod:`ziprl.learner.sft`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from ziprl.config import ZipRLConfig
from ziprl.env.scripted import ScriptedTeacher
from ziprl.env.search_env import SearchCompressEnv
from ziprl.outputs import check_file
from ziprl.paths import atomic_path
from ziprl.retrieval.datasets import load_dataset, retriever_config_for
from ziprl.retrieval.types import QAExample, RetrieverLike

SCHEMA = pa.schema([("question_id", pa.string()), ("source", pa.string()), ("turn", pa.int32()),
                    ("messages", pa.string()), ("response", pa.string()), ("action", pa.string()),
                    ("level", pa.int8()), ("q_com", pa.float64())])
GENERATOR_KEY, GENERATOR = b"ziprl.generator", b"ziprl.demos"  # Parquet schema metadata: who wrote the file


def synthesize(cfg: ZipRLConfig, examples: list[QAExample], retriever: RetrieverLike,
               progress: bool = True) -> tuple[list[dict], dict[str, int]]:
    """Transitions of the kept (correct and well-formed) episodes, and counts of kept/dropped episodes."""
    env = SearchCompressEnv(cfg.env, retriever=retriever, examples=examples)
    teacher = ScriptedTeacher()
    rows: list[dict] = []
    counts = {"episodes": 0, "kept": 0, "wrong": 0, "malformed": 0, "no_supporting_titles": 0}
    for ex in tqdm(examples, desc="demos", unit="q", disable=not progress):
        if not ex.supporting_titles:
            counts["no_supporting_titles"] += 1
            continue
        counts["episodes"] += 1
        _, info = env.reset(options={"example": ex})
        episode, done, ok = [], False, True
        while not done:
            messages, response = info["messages"], teacher.respond(env)
            _, _, term, trunc, info = env.step(response)
            ok &= info["format_error"] is None and info["tool_error"] is None
            episode.append({"question_id": ex.id, "source": ex.source, "turn": info["turn"],
                            "messages": json.dumps(messages, ensure_ascii=False), "response": response,
                            "action": info["action"], "level": info["level"], "q_com": info["q_com"]})
            done = term or trunc
        if not ok:
            counts["malformed"] += 1
        elif not (term and info.get("em") == 1.0):
            counts["wrong"] += 1
        else:
            counts["kept"] += 1
            rows.extend(episode)
    return rows, counts


def is_demos_file(path: Path) -> bool:
    """Whether ``path`` is a Parquet file :func:`write_demos` wrote (its schema metadata says so)."""
    try:
        return (pq.read_schema(path).metadata or {}).get(GENERATOR_KEY) == GENERATOR
    except (OSError, pa.ArrowException):
        return False


def write_demos(rows: list[dict], path: str | Path) -> Path:
    """Write the transitions to ``path`` atomically; refused (OutputError) over a file that is not a demos file."""
    path = check_file(path, True, is_demos_file, "a demos file ziprl.demos wrote", "demos.parquet")
    with atomic_path(path) as tmp:
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA.with_metadata({GENERATOR_KEY: GENERATOR})), tmp)
    return path


def demo_examples(cfg: ZipRLConfig) -> list[QAExample]:
    """The questions the teacher plays: each of ``cfg.demos.datasets``, loaded and checked (DatasetError on bad
    input, before any episode is played)."""
    examples: list[QAExample] = []
    for name in cfg.demos.datasets:
        found = load_dataset(name, cfg.data.shared_dir, max_question_chars=cfg.data.max_question_chars)
        if cfg.demos.limit:  # the first `limit` questions of each dataset that the teacher can play
            found = [ex for ex in found if ex.supporting_titles][: cfg.demos.limit]
        examples += found
    return examples


def build_demos(cfg: ZipRLConfig, retriever: RetrieverLike | None = None, progress: bool = True,
                examples: list[QAExample] | None = None) -> tuple[Path, dict]:
    """Synthesize demonstrations for ``examples`` (default: :func:`demo_examples`) and write them to
    ``cfg.demos.out``."""
    from ziprl.retrieval.retriever import Retriever

    examples = demo_examples(cfg) if examples is None else examples
    if retriever is None:
        first = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, dataset=cfg.demos.datasets[0]))
        retriever = Retriever.from_config(retriever_config_for(first))
    rows, counts = synthesize(cfg, examples, retriever, progress)
    counts["transitions"] = len(rows)
    path = write_demos(rows, cfg.demos.out)
    return path, counts
