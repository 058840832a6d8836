"""Load the trajectory Parquet files of a run: a compact episode index, one episode's turns, per-step stats.

Reading is tolerant: columns and per-turn fields that a file lacks get defaults, extra columns are dropped and
extra per-turn fields shown as they are (time values as text), so files written by older or newer ZipRL versions
still open. A file that is no readable trajectory file (not Parquet, truncated, a column of the wrong type, a name
given twice, a per-turn value Python cannot hold) is skipped and listed in ``Run.skipped``; a run with no readable
file at all is a ValueError.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ziprl.boundary import UserError, one_line
from ziprl.env.protocol import parse_turn, unescape

INDEX_COLUMNS = ("id", "qid", "question", "gold", "answer", "reward", "em", "f1", "turns", "strategy", "version",
                 "step", "finished", "errors", "source", "tokens")
TEXT_LIMIT = 20_000  # characters of one decoded text shown per field (the rest is cut with a marker)
_STEP_RE = re.compile(r"step_0*(\d+)")
_OBS_HEAD = "OBSERVATION (turn "
_OBS_RE = re.compile(r"(\d+), ([^\n]*)\):\n<observation>\n(.*?)\n</observation>", re.DOTALL)  # after _OBS_HEAD
_MEMORY_RE = re.compile(r"(Memory \([^\n]*\):\n.*?)\n\n(?:OBSERVATION|No observation yet)", re.DOTALL)
_NOTICE_RE = re.compile(r"NOTICE: ([^\n]*)")



class ViewerError(UserError, ValueError):
    """A run, file or option the viewer cannot use; the message names it and the fix (exit 2)."""

@dataclass
class Source:
    """One trajectory file: its label (e.g. 'step 3' or 'eval adaptive'), training step (None for eval) and table
    (as :func:`read_source` returns it)."""

    path: Path
    label: str
    step: int | None
    table: pa.Table
    first_id: int = 0  # global episode id of row 0


@dataclass
class Run:
    """All trajectory files of a run, with a global episode id = position across the files in order."""

    name: str
    sources: list[Source] = field(default_factory=list)
    decode: Callable[[list[int]], str] | None = None  # prompt ids -> text, when a tokenizer is available
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # files left out, and why

    @property
    def num_episodes(self) -> int:
        return sum(s.table.num_rows for s in self.sources)

    def locate(self, episode_id: int) -> tuple[Source, int]:
        """The file holding global episode ``episode_id`` and its row there."""
        for s in self.sources:
            if s.first_id <= episode_id < s.first_id + s.table.num_rows:
                return s, episode_id - s.first_id
        raise KeyError(f"no episode {episode_id} (the run has {self.num_episodes})")


def find_files(path: Path) -> list[Path]:
    """Trajectory files under a run directory (training steps in step order, then eval files), or the file itself."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is neither a trajectory Parquet file nor a run directory")
    steps = sorted(_files(path / "trajectories", "step_*.parquet"), key=lambda p: _step_of(p) or 0)
    files = steps + sorted(_files(path, "trajectories_*.parquet"))
    if not files:
        files = sorted(p for p in path.rglob("*.parquet") if p.is_file())
    if not files:
        raise FileNotFoundError(f"no trajectory Parquet files under {path} (expected trajectories/step_*.parquet "
                                "from train/launch or trajectories_<strategy>.parquet from eval)")
    return files


def _files(folder: Path, pattern: str) -> list[Path]:
    return [p for p in folder.glob(pattern) if p.is_file()]


def _step_of(path: Path) -> int | None:
    m = _STEP_RE.fullmatch(path.stem)
    return int(m.group(1)) if m else None


def _label(path: Path, step: int | None) -> str:
    if step is not None:
        return f"step {step}"
    if path.stem.startswith("trajectories_"):
        return f"eval {path.stem.removeprefix('trajectories_')}"
    return path.stem


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or (pa.types.is_dictionary(t) and _is_text(t.value_type))


def _is_list_of(inner: Callable[[pa.DataType], bool]) -> Callable[[pa.DataType], bool]:
    return lambda t: (pa.types.is_list(t) or pa.types.is_large_list(t)) and (inner(t.value_type) or pa.types.is_null(t.value_type))


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


_TEXT, _INT, _NUMBER = ("text", _is_text), ("an integer", pa.types.is_integer), ("a number", _is_number)
_TEXT_LIST, _INT_LIST = ("a list of text", _is_list_of(_is_text)), ("a list of integers", _is_list_of(pa.types.is_integer))
# The type each column (and per-turn field) the viewer reads must have, when a file has it (a null column is absent).
COLUMN_TYPES = {"question_id": _TEXT, "question": _TEXT, "answers": _TEXT_LIST, "reward": _NUMBER, "em": _NUMBER,
                "f1": _NUMBER, "strategy": _TEXT, "policy_version": _INT, "finished": _NUMBER, "group_id": _TEXT,
                "sample_index": _INT}
TURN_TYPES = {"response_text": _TEXT, "action": _TEXT, "level": _INT, "q_com": _NUMBER, "response_tokens": _INT,
              "prompt_ids": _INT_LIST}
HIDDEN_TURN_FIELDS = ("response_ids", "logprobs")  # never shown: dropped when a file is read


def _is_turns(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_struct(t.value_type)


def _twice(names: list[str]) -> tuple[str, int] | None:
    """A name given more than once in ``names``, and how often (None if each is given once)."""
    return next(((n, k) for n, k in Counter(names).items() if k > 1), None)


def schema_problem(schema: pa.Schema) -> str | None:
    """Why a table with ``schema`` is no trajectory table the viewer can show (None if it is one)."""
    if twice := _twice(schema.names):
        return f"column {twice[0]!r} is given {twice[1]} times, expected each column once"
    for name in ("question", "turns"):
        if name not in schema.names:
            return f"no {name!r} column (columns: {', '.join(schema.names[:8])})"
    if not _is_turns(schema.field("turns").type):
        return f"column 'turns' is {schema.field('turns').type}, expected a list of per-turn structs"
    if twice := _twice([f.name for f in schema.field("turns").type.value_type]):
        return f"per-turn field {twice[0]!r} is given {twice[1]} times in 'turns', expected each field once"
    fields = {f.name: f.type for f in schema}
    turn_fields = {f.name: f.type for f in schema.field("turns").type.value_type}
    for where, types, have in (("column", COLUMN_TYPES, fields), ("per-turn field", TURN_TYPES, turn_fields)):
        for name, (kind, ok) in types.items():
            if name in have and not (pa.types.is_null(have[name]) or ok(have[name])):
                return f"{where} {name!r} is {have[name]}, expected {kind}"
    return None


def null_problem(table: pa.Table) -> str | None:
    """Why a table that passed :func:`schema_problem` still cannot be shown: a null turn inside an episode's
    'turns' or a null id inside a turn's 'prompt_ids' (None if there is neither)."""
    for chunk in table.column("turns").chunks:
        turns = chunk.flatten()  # the turns of all episodes (null episodes' lists hold none)
        if turns.null_count:
            return f"column 'turns' holds {turns.null_count} null turn(s), expected a per-turn struct each"
        if "prompt_ids" in {f.name for f in turns.type}:
            ids = turns.field("prompt_ids")
            if not pa.types.is_null(ids.type) and (n := ids.flatten().null_count):
                return f"per-turn field 'prompt_ids' holds {n} null id(s), expected integers only"
    return None


def _is_time(t: pa.DataType) -> bool:
    return pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_duration(t)


def _times_as_text(t: pa.DataType) -> pa.DataType:
    """``t`` with every time type in it (timestamp, date, time, duration) as text: Arrow holds times that Python's
    datetime cannot (year 10,000 and later), and its text of them says 'value out of range' instead of failing."""
    if _is_time(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_times_as_text(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        value = t.value_field.with_type(_times_as_text(t.value_type))
        return (pa.list_(value, t.list_size) if pa.types.is_fixed_size_list(t)
                else pa.large_list(value) if pa.types.is_large_list(t) else pa.list_(value))
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_times_as_text(t.key_type)),
                       t.item_field.with_type(_times_as_text(t.item_type)))
    return t


def _shown_turns(table: pa.Table) -> pa.Table:
    """``table`` with the per-turn fields the viewer shows, times as text; ViewerError naming the per-turn field whose
    values Python cannot hold."""
    turns = table.column("turns")
    item = turns.type.value_field.with_type(
        _times_as_text(pa.struct([f for f in turns.type.value_type if f.name not in HIDDEN_TURN_FIELDS])))
    shown = pa.large_list(item) if pa.types.is_large_list(turns.type) else pa.list_(item)
    what = "column 'turns'"
    try:
        if shown != turns.type:
            table = table.set_column(table.column_names.index("turns"), "turns", turns.cast(shown))
        for chunk in table.column("turns").chunks:  # the fields episode() shows unchecked: convert them once here
            values = chunk.flatten()
            for name in [f.name for f in values.type if f.name not in TURN_TYPES]:
                what = f"per-turn field {name!r}"
                values.field(name).to_pylist()
    except (ValueError, OverflowError, pa.ArrowException) as exc:
        raise ViewerError(f"not a ZipRL trajectory file: {what} cannot be shown ({one_line(exc)[:200]}); drop it "
                          "from the file") from None
    return table


def read_source(path: Path) -> pa.Table:
    """One trajectory file's table as the viewer shows it: the columns it reads, the per-turn fields of
    :func:`_shown_turns`; ValueError saying why it is not one."""
    try:
        schema = pq.read_schema(path)
        problem = schema_problem(schema)
        shown = [n for n in schema.names if n in COLUMN_TYPES or n == "turns"]
        table = None if problem else pq.read_table(path, columns=shown)
    except (pa.ArrowException, OSError, MemoryError) as exc:
        raise ViewerError(f"not a readable Parquet file ({one_line(exc)[:200]})") from None
    problem = problem or null_problem(table)
    if problem:
        raise ViewerError(f"not a ZipRL trajectory file: {problem}")
    return _shown_turns(table)


def load_run(path: str | Path, decode: Callable[[list[int]], str] | None = None) -> Run:
    """Open every trajectory file of a run (a directory) or one file; unreadable ones go to ``Run.skipped``."""
    if "\0" in str(path):
        raise ViewerError(f"trajectory path {str(path)[:200]!r} holds a NUL byte (\\0); remove it")
    path = Path(path)
    run = Run(name=path.name or str(path), decode=decode)
    first = 0
    for f in find_files(path):
        try:
            table = read_source(f)
        except ValueError as exc:
            run.skipped.append((f, str(exc)))
            continue
        step = _step_of(f)
        run.sources.append(Source(f, _label(f, step), step, table, first))
        first += table.num_rows
    if not run.sources:
        f, why = run.skipped[0]
        n = len(run.skipped)
        what = f"{f} is {why}" if n == 1 else f"no readable trajectory file of the {n} files under {path}: " \
                                              f"{f} is {why} (and {n - 1} more)"
        raise ViewerError(f"{what}; point at a run directory or a trajectory Parquet file written by ziprl.train, "
                         "ziprl.launch or ziprl.eval")
    return run


def _column(table: pa.Table, name: str, default: Any) -> list[Any]:
    if name not in table.column_names:
        return [default] * table.num_rows
    return [default if v is None else v for v in table.column(name).to_pylist()]


def _turn_field(turns: pa.ListArray, name: str) -> pa.Array | None:
    """One per-turn field over all turns of all episodes (flattened), or None if the files lack it."""
    values = turns.flatten()
    types = {f.name: f.type for f in values.type}
    return values.field(name) if name in types and not pa.types.is_null(types[name]) else None


def final_answer(response_text: str) -> str:
    """The argument of an <answer> turn ('' when the turn has none)."""
    parsed = parse_turn(response_text or "")
    return unescape(parsed.argument) if parsed.action == "answer" else ""


def _per_episode(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Sum of a flattened per-turn array over each episode's turns (episodes without turns get 0)."""
    csum = np.concatenate([[0], np.cumsum(values.astype(np.int64))])
    return csum[offsets[1:]] - csum[offsets[:-1]]


def _source_index(s: Source) -> list[list[Any]]:
    t = s.table
    turns = t.column("turns").combine_chunks()
    offsets = np.asarray(turns.offsets)
    n_turns = np.diff(offsets)
    texts = _turn_field(turns, "response_text")
    texts = texts.to_pylist() if texts is not None else [""] * int(offsets[-1])
    actions = _turn_field(turns, "action")
    actions = actions.to_pylist() if actions is not None else [""] * int(offsets[-1])
    errors = _turn_field(turns, "format_error")
    err = np.asarray(pc.is_valid(errors)) if errors is not None else np.zeros(int(offsets[-1]), bool)
    tok = _turn_field(turns, "response_tokens")
    tok = np.asarray(tok.fill_null(0)) if tok is not None else np.zeros(int(offsets[-1]), np.int64)
    err_counts, tok_counts = _per_episode(err, offsets), _per_episode(tok, offsets)
    cols = {name: _column(t, name, d) for name, d in [
        ("question_id", ""), ("question", ""), ("answers", []), ("reward", 0.0), ("em", 0.0), ("f1", 0.0),
        ("strategy", ""), ("policy_version", 0), ("finished", False)]}
    rows = []
    for i in range(t.num_rows):
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        answer = final_answer(texts[hi - 1]) if hi > lo and actions[hi - 1] == "answer" else ""
        rows.append([s.first_id + i, cols["question_id"][i], cols["question"][i], " | ".join(a for a in cols["answers"][i] if a is not None), answer,
                     round(float(cols["reward"][i]), 4), round(float(cols["em"][i]), 4), round(float(cols["f1"][i]), 4),
                     int(n_turns[i]), cols["strategy"][i], int(cols["policy_version"][i]), s.step,
                     bool(cols["finished"][i]), int(err_counts[i]), s.label, int(tok_counts[i])])
    return rows


def build_index(run: Run) -> dict[str, Any]:
    """The episode list as compact JSON: ``{"columns": [...], "rows": [[...], ...], "sources": [...]}``."""
    rows = [r for s in run.sources for r in _source_index(s)]
    return {"columns": list(INDEX_COLUMNS), "rows": rows, "sources": [s.label for s in run.sources], "name": run.name}


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= TEXT_LIMIT:
        return text
    return text[:TEXT_LIMIT] + f"\n… [{len(text) - TEXT_LIMIT} more characters not shown]"


def last_observation(prompt: str) -> re.Match | None:
    """The prompt's last complete observation block (groups: turn, label, text). Each header's text is searched only
    up to the next header, so a prompt of many unclosed headers takes linear time, not quadratic."""
    for part in reversed(prompt.split(_OBS_HEAD)[1:]):
        if (m := _OBS_RE.match(part)) is not None:
            return m
    return None


def prompt_parts(prompt: str) -> dict[str, str | None]:
    """What a decoded prompt showed the agent: memory notes, the pending raw observation, a notice."""
    obs = last_observation(prompt)
    memory = _MEMORY_RE.search(prompt)
    notice = _NOTICE_RE.search(prompt)
    return {
        "memory": unescape(memory.group(1)) if memory else None,
        "observation": unescape(obs.group(3)) if obs else None,
        "observation_label": unescape(obs.group(2)) if obs else None,
        "notice": unescape(notice.group(1)) if notice else None,
    }


def episode(run: Run, episode_id: int) -> dict[str, Any]:
    """One episode, turn by turn, with the notes kept so far and (with a tokenizer) what each prompt showed;
    ViewerError naming the file when its row is no Python data."""
    s, row = run.locate(episode_id)
    try:
        ep = s.table.slice(row, 1).to_pylist()[0]
    except (ValueError, OverflowError, pa.ArrowException) as exc:
        raise ViewerError(f"episode {episode_id} in {s.path} cannot be shown ({one_line(exc)[:200]}); open the run "
                          "without that file") from None
    turns_out, notes = [], []
    for n, t in enumerate(ep.get("turns") or [], start=1):
        text = t.get("response_text") or ""
        parsed = parse_turn(text)
        turn = {k: t.get(k) for k in ("action", "level", "q_com", "q_ratio", "q_level", "q_info", "q_sem",
                                      "format_error", "observation_chars", "context_chars", "prompt_tokens",
                                      "response_tokens")}
        extra = {k: v for k, v in t.items() if k not in turn and k not in ("prompt_ids", "response_text")}
        turn.update(turn=n, response=_cut(text), argument=unescape(parsed.argument) if parsed.action else None,
                    note=_cut(unescape(parsed.compression)) if parsed.compression else None,
                    note_level=parsed.level, memory_before=[dict(m) for m in notes], extra=extra)
        if run.decode is not None and t.get("prompt_ids"):
            turn.update({k: _cut(v) for k, v in prompt_parts(run.decode(t["prompt_ids"])).items()})
        if parsed.error is None and parsed.compression:
            notes.append({"turn": n, "level": parsed.level, "text": _cut(unescape(parsed.compression))})
        turns_out.append(turn)
    answers = ep.get("answers") or []
    last = (ep.get("turns") or [{}])[-1] if ep.get("turns") else {}
    return {
        "id": episode_id, "qid": ep.get("question_id", ""), "question": ep.get("question", ""), "gold": answers,
        "answer": final_answer(last.get("response_text", "")) if last.get("action") == "answer" else "",
        "reward": ep.get("reward", 0.0), "em": ep.get("em", 0.0), "f1": ep.get("f1", 0.0),
        "finished": ep.get("finished", False), "strategy": ep.get("strategy", ""),
        "version": ep.get("policy_version", 0), "step": s.step, "source": s.label,
        "group": ep.get("group_id", ""), "sample": ep.get("sample_index", 0), "turns": turns_out,
    }


def step_stats(run: Run) -> list[dict[str, Any]]:
    """Per file (training step or eval strategy): mean reward, mean Q_com and the level distribution of turns."""
    out = []
    for s in run.sources:
        turns = s.table.column("turns").combine_chunks()
        q = _turn_field(turns, "q_com")
        lv = _turn_field(turns, "level")
        q_vals = np.asarray(q.drop_null(), float) if q is not None else np.zeros(0)
        levels = np.asarray(lv.drop_null(), int) if lv is not None else np.zeros(0, int)
        counts = [int((levels == g).sum()) for g in range(1, 6)]
        total = sum(counts)
        rewards = np.asarray(_column(s.table, "reward", 0.0), float)
        out.append({"label": s.label, "step": s.step, "episodes": s.table.num_rows,
                    "reward": float(rewards.mean()) if len(rewards) else 0.0,
                    "q_com": float(q_vals.mean()) if len(q_vals) else None,
                    "levels": [c / total if total else 0.0 for c in counts]})
    return out
