"""Cold-start demonstrations: the scripted teacher plays episodes through the real retriever.

    python -m ziprl.demos [--datasets hotpotqa,musique] [--limit 100] [--out runs/demos.parquet]
                          [--config FILE.yaml] [--set section.field=value ...]

The teacher searches each supporting title, opens the matching passage, writes an extractive note at a
level chosen by relevance to the question (more supporting content -> finer level) and answers gold.
As in the paper, only correct, well-formed trajectories are kept; the file holds one row per transition
(``messages`` as JSON, ``response``) for transition-level SFT.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from ziprl.config import ConfigError, ZipRLConfig, load_config
from ziprl.env import SearchCompressEnv
from ziprl.env.datasets import load_dataset
from ziprl.env.scripted import ScriptedTeacher
from ziprl.env.types import QAExample, RetrieverLike
from ziprl.errors import run_command

SCHEMA = pa.schema([("question_id", pa.string()), ("source", pa.string()), ("turn", pa.int32()),
                    ("messages", pa.string()), ("response", pa.string()), ("action", pa.string()),
                    ("level", pa.int8()), ("q_com", pa.float64())])


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


def write_demos(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp)
    tmp.replace(path)
    return path


def build_demos(cfg: ZipRLConfig, retriever: RetrieverLike | None = None, progress: bool = True) -> tuple[Path, dict]:
    """Synthesize demonstrations for ``cfg.demos.datasets`` and write them to ``cfg.demos.out``."""
    from ziprl.env.retriever import Retriever
    from ziprl.eval import retriever_config_for

    examples: list[QAExample] = []
    for name in cfg.demos.datasets:
        found = load_dataset(name, cfg.data.shared_dir)
        if cfg.demos.limit:  # the first `limit` questions of each dataset that the teacher can play
            found = [ex for ex in found if ex.supporting_titles][: cfg.demos.limit]
        examples += found
    if retriever is None:
        first = cfg.demos.datasets[0]
        data_cfg = ZipRLConfig(retriever=cfg.retriever, data=type(cfg.data)(dataset=first, shared_dir=cfg.data.shared_dir))
        retriever = Retriever.from_config(retriever_config_for(data_cfg))
    rows, counts = synthesize(cfg, examples, retriever, progress)
    counts["transitions"] = len(rows)
    path = write_demos(rows, cfg.demos.out)
    return path, counts


@run_command
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--datasets", help="comma-separated dataset names (sample, hotpotqa, musique, pooled, a path)")
    ap.add_argument("--limit", type=int, help="questions per dataset (0 = all)")
    ap.add_argument("--out")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = ap.parse_args(argv)
    flags = {"demos.datasets": args.datasets, "demos.limit": args.limit, "demos.out": args.out}
    try:
        cfg = load_config(args.config, [f"{k}={v}" for k, v in flags.items() if v is not None] + args.set)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    path, counts = build_demos(cfg)
    print(f"[demos] kept {counts['kept']}/{counts['episodes']} episodes ({counts['wrong']} wrong, "
          f"{counts['malformed']} malformed, {counts['no_supporting_titles']} without supporting titles); "
          f"{counts['transitions']} transitions -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
