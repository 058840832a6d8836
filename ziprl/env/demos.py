"""Cold-start demonstrations: the scripted teacher plays episodes through the real retriever.

The teacher searches each supporting title, opens the matching passage, writes an extractive note at a
level chosen by relevance to the question (more supporting content -> finer level) and answers gold.
As in the paper, only correct, well-formed trajectories are kept; the file holds one row per transition
(``messages`` as JSON, ``response``) for transition-level SFT (:mod:`ziprl.learner.sft`).

A run stopped by SIGINT or SIGTERM (at the end of the episode under way), or killed, keeps its progress in
``<out>.partial`` (written every ``demos.checkpoint_every`` episodes and on a stop); the same build continues from
it, checked field by field against its settings and questions, and deletes it once ``<out>`` is written.

The command holds :func:`ziprl.outputs.hold` (an ``fcntl.flock`` on ``.<name>.ziprl-lock`` beside ``<out>``) for its whole life,
so a second one on the same ``<out>`` is refused, and removes the temporary files a killed run's atomic writes left
(:func:`remove_temps`). :func:`build_demos` never replaces an ``<out>`` that changed while it played.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from ziprl.boundary import UserError
from ziprl.config import RetrieverConfig, ZipRLConfig, differences
from ziprl.env.scripted import ScriptedTeacher
from ziprl.env.search_env import SearchCompressEnv
from ziprl.outputs import OutputError, check_file
from ziprl.paths import LEFTOVER, atomic_path
from ziprl.retrieval.datasets import DatasetError, corpus_source, load_dataset, retriever_config_for
from ziprl.retrieval.types import QAExample, RetrieverLike

SCHEMA = pa.schema([("question_id", pa.string()), ("source", pa.string()), ("turn", pa.int32()),
                    ("messages", pa.string()), ("response", pa.string()), ("action", pa.string()),
                    ("level", pa.int8()), ("q_com", pa.float64())])
GENERATOR_KEY, GENERATOR = b"ziprl.generator", b"ziprl.demos"  # Parquet schema metadata: who wrote the file
PARTIAL = b"ziprl.demos.partial"  # the generator of a stopped run's progress file (:func:`write_partial`)
PROGRESS_KEY = b"ziprl.progress"  # its position, counts and settings (JSON)
COUNTS = ("episodes", "kept", "wrong", "malformed", "no_supporting_titles")


class DemoResumeError(UserError):
    """A stopped demos run cannot be continued as asked; the message says why and what to pass instead."""


@dataclass
class DemoProgress:
    """Where a demos run stands: questions played (in order), the kept episodes' transitions, episode counts."""

    done: int = 0
    rows: list[dict] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))


def play(env: SearchCompressEnv, teacher: ScriptedTeacher, ex: QAExample) -> tuple[str, list[dict]]:
    """One teacher episode on ``ex``: its outcome (a :data:`COUNTS` name other than ``episodes``) and transitions."""
    if not ex.supporting_titles:
        return "no_supporting_titles", []
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
        return "malformed", episode
    return ("kept" if term and info.get("em") == 1.0 else "wrong"), episode


def synthesize(cfg: ZipRLConfig, examples: list[QAExample], retriever: RetrieverLike, progress: bool = True,
               state: DemoProgress | None = None, stop: Callable[[], None] | None = None,
               save: Callable[[DemoProgress], None] | None = None) -> tuple[list[dict], dict[str, int]]:
    """Transitions of the kept (correct and well-formed) episodes, and counts of kept/dropped episodes.

    Continues ``state`` (a stopped run's :class:`DemoProgress`). ``save`` is given the progress every
    ``demos.checkpoint_every`` episodes; ``stop`` is called after each question, and a
    :class:`ziprl.loop.stop.Stop` it raises (a SIGINT or SIGTERM) saves the progress, then stops."""
    env = SearchCompressEnv(cfg.env, retriever=retriever, examples=examples)
    teacher, state = ScriptedTeacher(), state or DemoProgress()
    every = cfg.demos.checkpoint_every
    with tqdm(total=len(examples), initial=state.done, desc="demos", unit="q", disable=not progress) as bar:
        try:
            while state.done < len(examples):
                outcome, episode = play(env, teacher, examples[state.done])
                state.counts["episodes"] += outcome != "no_supporting_titles"
                state.counts[outcome] += 1
                state.rows.extend(episode if outcome == "kept" else ())
                state.done += 1
                bar.update()
                if save is not None and every and state.done % every == 0 and state.done < len(examples):
                    save(state)
                if stop is not None:
                    stop()
        except KeyboardInterrupt as exc:  # a Stop from ``stop`` (between questions) says whether to save
            if save is not None and getattr(exc, "checkpoint", False):
                save(state)
                print(f"\n[demos] stopped after question {state.done} of {len(examples)}; the same command with "
                      "--resume continues from there", flush=True)
            raise
    return state.rows, state.counts


def written_by(path: Path) -> bytes | None:
    """The generator in a Parquet file's schema metadata (:data:`GENERATOR`, :data:`PARTIAL`), None for any other
    file."""
    try:
        return (pq.read_schema(path).metadata or {}).get(GENERATOR_KEY)
    except (OSError, pa.ArrowException):
        return None


def is_demos_file(path: Path) -> bool:
    """Whether ``path`` is a Parquet file :func:`write_demos` wrote (its schema metadata says so)."""
    return written_by(path) == GENERATOR


def is_partial_file(path: Path) -> bool:
    """Whether ``path`` is the progress file :func:`write_partial` wrote."""
    return written_by(path) == PARTIAL


def write_rows(rows: list[dict], path: str | Path, meta: dict[bytes, bytes], owned: Callable[[Path], bool],
               what: str) -> Path:
    """The transitions ``rows`` to ``path`` atomically, with ``meta`` in the schema; refused (OutputError) over a
    file ``owned`` does not prove is ``what``."""
    path = check_file(path, True, owned, what, "demos.parquet")
    with atomic_path(path) as tmp:
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA.with_metadata(meta)), tmp)
    return path


def write_demos(rows: list[dict], path: str | Path) -> Path:
    """Write the transitions to ``path`` atomically; refused (OutputError) over a file that is not a demos file."""
    return write_rows(rows, path, {GENERATOR_KEY: GENERATOR}, is_demos_file, "a demos file ziprl.demos wrote")


def partial_path(out: str | Path) -> Path:
    """Where a stopped run writing ``out`` keeps its progress."""
    out = Path(out)
    return out.with_name(out.name + ".partial")


def remove_temps(out: Path) -> list[Path]:
    """Remove, and return, the temporary files a killed run writing ``out`` left beside it: those
    :data:`ziprl.paths.LEFTOVER` names of ``out`` and of its progress file, plain files with one name, empty or begun
    as Parquet; call it holding :func:`ziprl.outputs.hold`, as no write is under way then."""
    names, found = {out.name, partial_path(out).name}, []
    for entry in sorted(os.scandir(out.parent), key=lambda e: e.name) if out.parent.is_dir() else ():
        leftover = LEFTOVER.fullmatch(entry.name)
        if leftover and leftover[1] in names and entry.name.endswith(".tmp") and _is_torn_parquet(Path(entry.path)):
            os.unlink(entry.path)
            found.append(Path(entry.path))
    return found


def _is_torn_parquet(path: Path) -> bool:
    """Whether ``path`` is what a Parquet write leaves when killed: a plain file with one name, empty or starting
    with the Parquet magic."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            return False
        with open(path, "rb") as f:
            return f.read(4) in (b"", b"PAR1")
    except OSError:
        return False


def stamp(path: Path) -> tuple[int, ...] | None:
    """What ``path`` is now (device, inode, size, modification time), None when missing: compared, not read."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def demo_settings(cfg: ZipRLConfig, examples: list[QAExample]) -> dict:
    """What the transitions are made from: the env and retriever settings, the QA sets, and the questions (their
    number and a sha256 of their content), compared field by field when a stopped run is continued."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps([ex.id, ex.question, list(ex.answers), list(ex.supporting_titles), ex.source]).encode())
    return json.loads(json.dumps({"env": dataclasses.asdict(cfg.env), "retriever": dataclasses.asdict(cfg.retriever),
                                  "datasets": list(cfg.demos.datasets),
                                  "questions": {"count": len(examples), "sha256": h.hexdigest()}}))


def write_partial(state: DemoProgress, path: Path, settings: dict) -> None:
    """``state`` to the progress file ``path`` (atomically; refused over a file it did not write)."""
    meta = {GENERATOR_KEY: PARTIAL, PROGRESS_KEY: json.dumps(
        {"done": state.done, "counts": state.counts, "settings": settings}).encode()}
    write_rows(state.rows, path, meta, is_partial_file, "the progress file of a stopped ziprl.demos")


def read_partial(path: Path, settings: dict) -> DemoProgress:
    """The progress in ``path``; DemoResumeError when it is not a progress file or was made with other
    ``settings`` (naming the fields that differ)."""
    if not is_partial_file(path):
        raise DemoResumeError(f"--resume: {path} is not the progress file of a stopped ziprl.demos; drop --resume "
                              "to start again")
    table = pq.read_table(path)
    saved = json.loads(table.schema.metadata[PROGRESS_KEY])
    differ = differences(saved["settings"], settings)
    if differ:
        raise DemoResumeError(f"--resume: {path} was made with other settings or questions ({', '.join(differ[:3])}"
                              f"{', ...' if len(differ) > 3 else ''}); pass the ones it started with, or --overwrite "
                              "to start again")
    return DemoProgress(saved["done"], table.to_pylist(), saved["counts"])


def demo_examples(cfg: ZipRLConfig) -> list[QAExample]:
    """The questions the teacher plays: each of ``cfg.demos.datasets``, loaded and checked (DatasetError on bad
    input, before any episode is played; a question id in two of them too: it would be played twice)."""
    examples: list[QAExample] = []
    names = cfg.demos.datasets
    where: dict[str, int] = {}  # question id -> the (first) listed dataset that holds it
    for i, name in enumerate(names):
        found = load_dataset(name, cfg.data.shared_dir, max_question_chars=cfg.data.max_question_chars)
        for ex in found:
            if where.setdefault(ex.id, i) != i:
                raise DatasetError(f"question {ex.id!r} is in both {names[where[ex.id]]} and {name}, and would be played "
                                   "twice; list each dataset once in demos.datasets (--datasets), and no two that "
                                   "share questions")
        if cfg.demos.limit:  # the first `limit` questions of each dataset that the teacher can play
            found = [ex for ex in found if ex.supporting_titles][: cfg.demos.limit]
        examples += found
    return examples


def demo_retriever_config(cfg: ZipRLConfig) -> RetrieverConfig:
    """The retriever the teacher plays every dataset of ``cfg.demos.datasets`` on: the first one's
    (:func:`retriever_config_for`). DatasetError, before any episode, when no ``retriever.corpus`` or
    ``retriever.index_dir`` is set and the datasets' corpora differ (the others' answers would have no evidence)."""
    r = cfg.retriever
    if r.corpus is None and r.index_dir is None:
        sources: dict[Path | str, list[str]] = {}
        for name in cfg.demos.datasets:
            sources.setdefault(corpus_source(name), []).append(name)
        if len(sources) > 1:
            each = "; ".join(f"{', '.join(names)} on {source if isinstance(source, Path) else f'the {source} corpus'}"
                             for source, names in sources.items())
            raise DatasetError(f"demos.datasets search different corpora ({each}), but the teacher plays them all on "
                               "one retriever; run ziprl.demos once per corpus, or set retriever.corpus to one "
                               "corpus holding every passage they need")
    first = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, dataset=cfg.demos.datasets[0]))
    return retriever_config_for(first)


def resumed(path: Path, settings: dict, resume: bool | None) -> DemoProgress | None:
    """The progress :func:`build_demos` continues from: with ``resume`` True, the stopped run's in ``path``
    (DemoResumeError when there is none, or it was made with other ``settings``); None, that one when there is one
    that fits; False, none."""
    if resume is False or (resume is None and not os.path.lexists(path)):
        return None
    if resume and not os.path.lexists(path):
        raise DemoResumeError(f"--resume: no stopped run to continue ({path} does not exist); drop --resume")
    try:
        return read_partial(path, settings)
    except DemoResumeError:
        if resume:
            raise
        return None  # another build's progress, replaced by this one's


def build_demos(cfg: ZipRLConfig, retriever: RetrieverLike | None = None, progress: bool = True,
                examples: list[QAExample] | None = None, resume: bool | None = None,
                stop: Callable[[], None] | None = None) -> tuple[Path, dict]:
    """Synthesize demonstrations for ``examples`` (default: :func:`demo_examples`) on ``retriever`` (default:
    :func:`demo_retriever_config`'s) and write them to ``cfg.demos.out``, continuing a stopped run's progress as
    :func:`resumed` says (``stop``: see :func:`synthesize`)."""
    from ziprl.retrieval.retriever import Retriever

    examples = demo_examples(cfg) if examples is None else examples
    retriever_cfg = demo_retriever_config(cfg) if retriever is None else None
    settings, partial = demo_settings(cfg, examples), partial_path(cfg.demos.out)
    # what this run may replace: the demos file and the progress file as they are now, and what it saves itself
    before, seen = stamp(Path(cfg.demos.out)), stamp(partial)
    state = resumed(partial, settings, resume)
    if retriever is None:
        retriever = Retriever.from_config(retriever_cfg)

    def save(s: DemoProgress) -> None:
        nonlocal seen
        if stamp(partial) != seen:
            raise OutputError(f"{partial} was written by another process while this run played; it is kept as it is: "
                              "let that run finish, or move the file away and run again")
        write_partial(s, partial, settings)
        seen = stamp(partial)

    rows, counts = synthesize(cfg, examples, retriever, progress, state, stop, save=save)
    if stamp(Path(cfg.demos.out)) != before:
        save(DemoProgress(len(examples), rows, counts))
        raise OutputError(f"{cfg.demos.out} was written by another process while this run played; it is kept as it "
                          f"is, and this run's demos are in {partial}: move {cfg.demos.out} away and pass --resume "
                          "to write them")
    counts["transitions"] = len(rows)
    path = write_demos(rows, cfg.demos.out)
    if stamp(partial) == seen and is_partial_file(partial):
        partial.unlink()  # this run's progress, or the one it replaces: the demos it led to are written
    return path, counts
