"""The adversarial command table (issue 46): rows none of which are in the bad-command table, each run in a fresh
tree of the user's own files (a foreign folder, a FIFO, symbolic links, odd datasets), and each row's line for
docs/bad-commands.md. ``tests/test_adversarial_commands.py`` checks every row."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ziprl.testing.commands import COMMANDS, D
from ziprl.testing.viewer_data import write_run

HANG_S = 60  # a row still running after this long is a hang (refusals take well under a second)


@dataclass(frozen=True)
class Row:
    cmd: str
    what: str
    argv: tuple[str, ...]
    needle: str  # a word the error line must hold (case-insensitive): the path or the field it is about


def row(cmd: str, what: str, needle: str, *argv: str) -> Row:
    return Row(cmd, what, tuple(argv), needle)


# ------------------------------------------------------------------------------------------------ the user's tree


def demos_table(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"messages": [json.dumps([{"role": "user", "content": "Where is Paris?"}])],
                      "response": ['<compress level="1">Paris is in France.</compress>\n<answer>France</answer>']})
    pq.write_table(table, path)


def make_tree(d: Path) -> None:
    """The user's files every row runs among (nothing here was written by ZipRL)."""
    user = d / "user"
    (user / "sub").mkdir(parents=True)
    (user / "model").mkdir()
    (user / "a.txt").write_text("mine\n")
    (user / "sub" / "b.bin").write_bytes(bytes(range(256)))
    (user / "metrics.jsonl").write_text('{"mine": 1}\n')
    (user / "manifest.json").write_text("{}\n")
    (user / "index.html").write_text("<p>my page</p>\n")
    (user / "config.json").write_text('{"mine": true}\n')
    (user / "model" / "code.py").write_text("print('mine')\n")
    (d / "notes.txt").write_text("just text\n")
    (d / "report.html").write_text("<html><body>my own report</body></html>\n")
    demos_table(d / "demos.parquet")
    passages = [{"id": f"p{i}", "title": f"Town {i}", "text": f"Town {i} lies on the river Ulm{i}."} for i in range(3)]
    (d / "good.jsonl").write_text("".join(json.dumps(p) + "\n" for p in passages))
    for name, question in (("qa", "Which river runs through Town 1?"), ("surrogate", "Which river \ud800 runs?"),
                           ("huge", "Which river " + "very " * 200_000 + "long?")):
        (d / name).mkdir()
        (d / name / "corpus.jsonl").write_text((d / "good.jsonl").read_text())
        record = json.dumps({"id": "q1", "question": question, "answers": ["Ulm1"]})  # ensure_ascii keeps \ud800
        (d / name / "qa.jsonl").write_text(record + "\n")
    (d / "array").mkdir()
    (d / "array" / "qa.jsonl").write_text(json.dumps([{"id": "q1", "question": "Q?", "answers": ["A"]}]) + "\n")
    (d / "array" / "corpus.jsonl").write_text(json.dumps(passages) + "\n")
    os.mkfifo(d / "fifo")
    os.symlink("user", d / "link")
    os.symlink("nowhere", d / "dangling")
    (d / "markerdir" / ".ziprl-run").mkdir(parents=True)
    (d / "markerdir" / "metrics.jsonl").write_text("{}\n")
    (d / "dup.yaml").write_text("env:\n  max_turns: 3\n  max_turns: 4\n")
    (d / "dupsection.yaml").write_text("env:\n  max_turns: 3\nenv:\n  top_k: 2\n")
    (d / "nullout.yaml").write_text("run:\n  out_dir: null\n")
    write_run(d / "trajs", n=2, steps=1)


def snapshot(d: Path) -> dict[str, str]:
    """Every entry under ``d`` (never following a link): a file's sha256, a link's target, a folder, a FIFO."""
    out = {}
    for top, dirs, files in os.walk(d):
        for name in dirs + files:
            p = Path(top) / name
            rel = str(p.relative_to(d))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_fifo():
                out[rel] = "fifo"
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# ------------------------------------------------------------------------------------------------ the rows

# Every command that writes, with the arguments that make it write to OUT (the rest of its inputs are good).
WRITERS = {
    "ziprl.train": ("--out",),
    "ziprl.launch": ("--out",),
    "ziprl.sft": ("--demos", f"{D}/demos.parquet", "--out"),
    "ziprl.demos": ("--datasets", f"{D}/qa/qa.jsonl", "--out"),
    "ziprl.index build": ("build", "--corpus", f"{D}/good.jsonl", "--out"),
    "ziprl.eval": ("--out",),
    "ziprl.view": (f"{D}/trajs", "--out"),
}
DIR_WRITERS = ("ziprl.train", "ziprl.launch", "ziprl.sft", "ziprl.index build", "ziprl.eval")
FILE_WRITERS = ("ziprl.demos", "ziprl.view")
LONG = "x" * 300  # one path component longer than any file system allows

OUT_CASES = [  # (what, OUT, needle, commands it applies to)
    ("--out is a foreign non-empty directory", f"{D}/user", "user", DIR_WRITERS),
    ("--out reaches a foreign directory through a missing folder and '..'", f"{D}/nosuch/../user", "user",
     DIR_WRITERS),
    ("--out is a symbolic link to a foreign directory", f"{D}/link", "user", DIR_WRITERS),
    ("--out is a symbolic link with a trailing slash", f"{D}/link/", "user", DIR_WRITERS),
    ("--out is a dangling symbolic link", f"{D}/dangling", "dangling", DIR_WRITERS + FILE_WRITERS),
    ("--out is a user's text file", f"{D}/user/a.txt", "a.txt", DIR_WRITERS + FILE_WRITERS),
    ("--out lies under a user's file", f"{D}/user/a.txt/out", "a.txt", DIR_WRITERS + FILE_WRITERS),
    ("--out is a FIFO", f"{D}/fifo", "fifo", DIR_WRITERS + FILE_WRITERS),
    ("--out holds a NUL byte", f"{D}/a\x00b", "nul", DIR_WRITERS + FILE_WRITERS),
    ("--out is the working directory, not empty", ".", "", DIR_WRITERS),
    ("--out is the file-system root", "/", "/", DIR_WRITERS + FILE_WRITERS),
    ("--out is empty", "", "out", DIR_WRITERS + FILE_WRITERS),
    ("--out has a component too long for the file system", f"{D}/{LONG}/out", "long", DIR_WRITERS + FILE_WRITERS),
    ("--out is /dev/null", "/dev/null", "/dev/null", DIR_WRITERS + FILE_WRITERS),
    ("--out is a folder whose run marker is a directory", f"{D}/markerdir", "directory", DIR_WRITERS),
    ("--out is a user's file inside a folder", f"{D}/user/metrics.jsonl", "metrics.jsonl",
     DIR_WRITERS + FILE_WRITERS),
    ("--out is a user's folder given as the report file", f"{D}/user", "user", FILE_WRITERS),
    ("--out is under /proc", "/proc/self/ziprl-out", "/proc", DIR_WRITERS + FILE_WRITERS),
]
OVERWRITE_CASES = [  # (what, OUT, needle, commands): --overwrite must still refuse what the command did not write
    ("--overwrite of a foreign non-empty directory", f"{D}/user", "user", DIR_WRITERS),
    ("--overwrite through a symbolic link to a foreign directory", f"{D}/link", "user", DIR_WRITERS),
    ("--overwrite of a folder whose marker is a directory", f"{D}/markerdir", "directory", DIR_WRITERS),
    ("--overwrite of the working directory", ".", "", DIR_WRITERS),
    ("--overwrite of a user's HTML page", f"{D}/report.html", "report.html", ("ziprl.view",)),
    ("--overwrite of a user's Parquet file", f"{D}/demos.parquet", "demos.parquet", ("ziprl.demos",)),
    ("--overwrite of a user's text file", f"{D}/notes.txt", "notes.txt", DIR_WRITERS + FILE_WRITERS),
]


def writer_rows() -> list[Row]:
    rows = []
    for cases, extra in ((OUT_CASES, ()), (OVERWRITE_CASES, ("--overwrite",))):
        for what, out, needle, commands in cases:
            rows += [Row(name.split()[0], what, (*WRITERS[name], out, *extra), needle) for name in commands]
    return rows


CONFIG_COMMANDS = {  # every command that takes --set and --config, with arguments that are otherwise good
    "ziprl.config": ("--show",),
    "ziprl.train": ("--out", f"{D}/newrun"),
    "ziprl.launch": ("--out", f"{D}/newrun"),
    "ziprl.eval": ("--out", f"{D}/neweval"),
    "ziprl.demos": ("--out", f"{D}/new.parquet"),
    "ziprl.sft": ("--demos", f"{D}/demos.parquet", "--out", f"{D}/newsft"),
}
SET_CASES = [  # (what, --set value, needle)
    ("negative seed", "learner.seed=-1", "learner.seed"),
    ("negative data seed", "data.seed=-5", "data.seed"),
    ("negative thread count", "model.num_threads=-3", "model.num_threads"),
    ("CUDA on a machine without it", "model.device=cuda", "cuda"),
    ("unknown device", "model.device=tpu9", "model.device"),
    ("no retriever replicas", "ray.retriever_replicas=0", "ray.retriever_replicas"),
    ("negative learner CPUs", "ray.learner_cpus=-4", "ray.learner_cpus"),
    ("negative rollout GPUs", "ray.rollout_gpus=-1", "ray.rollout_gpus"),
    ("negative IVF probes", "retriever.nprobe=-1", "retriever.nprobe"),
    ("negative HNSW breadth", "retriever.ef_search=-8", "retriever.ef_search"),
    ("negative re-rank factor", "retriever.k_factor=-1", "retriever.k_factor"),
    ("negative snippet length", "retriever.snippet_chars=-1", "retriever.snippet_chars"),
    ("zero encoder batch", "retriever.batch_size=0", "retriever.batch_size"),
    ("a NUL byte in a path field", "model.cache_dir=a\x00b", "model.cache_dir"),
    ("a 100,000-character value", "env.strategy=" + "z" * 100_000, "env.strategy"),
    ("null output directory", "run.out_dir=null", "run.out_dir"),
]
CONFIG_FILE_CASES = [  # (what, --config value, needle)
    ("config with a duplicate key", f"{D}/dup.yaml", "max_turns"),
    ("config with a duplicate section", f"{D}/dupsection.yaml", "env"),
    ("config file is a FIFO", f"{D}/fifo", "fifo"),
    ("config path with a NUL byte", f"{D}/a\x00.yaml", "nul"),
]


def config_rows() -> list[Row]:
    rows = []
    for cmd, base in CONFIG_COMMANDS.items():
        rows += [row(cmd, what, needle, *base, "--set", value) for what, value, needle in SET_CASES]
        rows += [row(cmd, what, needle, *base, "--config", path) for what, path, needle in CONFIG_FILE_CASES]
    return rows


DATASET_CASES = [  # (what, dataset path, needle)
    ("a JSON array where JSONL belongs", f"{D}/array/qa.jsonl", "array"),
    ("a question with a lone surrogate", f"{D}/surrogate/qa.jsonl", "q1"),
    ("a one-megabyte question", f"{D}/huge/qa.jsonl", "q1"),
    ("a dataset that is a FIFO", f"{D}/fifo", "fifo"),
]
DATASET_FLAGS = {  # command -> how it takes a dataset path
    "ziprl.train": ("--out", f"{D}/newrun", "--set", "data.dataset={}"),
    "ziprl.launch": ("--out", f"{D}/newrun", "--set", "data.dataset={}"),
    "ziprl.eval": ("--out", f"{D}/neweval", "--limit", "1", "--max-turns", "1", "--dataset", "{}"),
    "ziprl.demos": ("--out", f"{D}/new.parquet", "--datasets", "{}"),
}


def dataset_rows() -> list[Row]:
    return [Row(cmd, what, tuple(a.format(path) if "{}" in a else a for a in argv), needle)
            for cmd, argv in DATASET_FLAGS.items() for what, path, needle in DATASET_CASES]


OTHER_ROWS = [
    row("ziprl.index", "build a corpus that is a FIFO", "fifo", "build", "--corpus", f"{D}/fifo", "--out", f"{D}/idx"),
    row("ziprl.index", "build a corpus that is a JSON array", "array", "build", "--corpus", f"{D}/array/corpus.jsonl",
        "--out", f"{D}/idx"),
    row("ziprl.index", "build a corpus path with a NUL byte", "nul", "build", "--corpus", f"{D}/a\x00.jsonl", "--out",
        f"{D}/idx"),
    row("ziprl.index", "adopt into a foreign directory", "user", "adopt", "--faiss", f"{D}/notes.txt", "--corpus",
        f"{D}/good.jsonl", "--out", f"{D}/user"),
    row("ziprl.index", "adopt through a link to a foreign directory", "user", "adopt", "--faiss", f"{D}/notes.txt",
        "--corpus", f"{D}/good.jsonl", "--out", f"{D}/link"),
    row("ziprl.index", "search an index that is a FIFO", "fifo", "search", "--index", f"{D}/fifo", "q"),
    row("ziprl.index", "search a foreign directory", "user", "search", "--index", f"{D}/user", "q"),
    row("ziprl.index", "open in a dangling link", "dangling", "open", "--index", f"{D}/dangling", "p1"),
    row("ziprl.sft", "demos file that is a FIFO", "fifo", "--demos", f"{D}/fifo", "--out", f"{D}/newsft"),
    row("ziprl.sft", "demos path with a NUL byte", "nul", "--demos", f"{D}/a\x00.parquet", "--out", f"{D}/newsft"),
    row("ziprl.sft", "demos file that is a JSON array", "parquet", "--demos", f"{D}/array/qa.jsonl", "--out",
        f"{D}/newsft"),
    row("ziprl.view", "trajectories that are a FIFO", "fifo", f"{D}/fifo"),
    row("ziprl.view", "trajectories path with a NUL byte", "nul", f"{D}/a\x00b"),
    row("ziprl.view", "a foreign directory of user files", "user", f"{D}/user"),
    row("ziprl.view", "--tokenizer that is a FIFO", "fifo", f"{D}/trajs", "--out", f"{D}/new.html", "--tokenizer",
        f"{D}/fifo"),
    row("ziprl.view", "--tokenizer that is a foreign directory", "user", f"{D}/trajs", "--out", f"{D}/new.html",
        "--tokenizer", f"{D}/user"),
    row("ziprl.eval", "--model that is a FIFO", "fifo", "--out", f"{D}/neweval", "--model", f"{D}/fifo"),
    row("ziprl.eval", "--model that is a foreign directory", "user", "--out", f"{D}/neweval", "--model", f"{D}/user"),
    row("ziprl.train", "--sft-checkpoint that is a FIFO", "fifo", "--out", f"{D}/newrun", "--sft-checkpoint",
        f"{D}/fifo"),
    row("ziprl.train", "--sft-checkpoint with a NUL byte", "nul", "--out", f"{D}/newrun", "--sft-checkpoint",
        f"{D}/a\x00b"),
    row("ziprl.train", "--resume a foreign directory", "user", "--out", f"{D}/user", "--resume"),
    row("ziprl.train", "--resume a folder whose marker is a directory", "directory", "--out", f"{D}/markerdir",
        "--resume"),
    row("ziprl.launch", "--resume a foreign directory", "user", "--out", f"{D}/user", "--resume"),
    row("ziprl.train", "retriever.corpus is a FIFO", "fifo", "--out", f"{D}/newrun", "--set",
        f"retriever.corpus={D}/fifo"),
    row("ziprl.eval", "retriever.corpus is a JSON array", "array", "--out", f"{D}/neweval", "--set",
        f"retriever.corpus={D}/array/corpus.jsonl"),
    row("ziprl.config", "config file read through a dangling link", "dangling", "--show", "--config",
        f"{D}/dangling"),
]

ROWS = writer_rows() + config_rows() + dataset_rows() + OTHER_ROWS


def run_row(r: Row, d: Path) -> tuple[int, str]:
    """Run one row in this process with ``d`` as the working directory; (exit code, stderr)."""
    err = io.StringIO()

    def hang(signum, frame):
        raise TimeoutError(f"no answer after {HANG_S} s")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(HANG_S)
    try:
        with contextlib.chdir(d), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = COMMANDS[r.cmd]([a.replace(D, str(d)) for a in r.argv])
            except SystemExit as exc:
                code = exc.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return code, err.getvalue().replace(str(d), "DIR")


def shown(r: Row) -> str:
    argv = [a.replace(D, "DIR").replace("\x00", "\\0") for a in r.argv]
    argv = [a if len(a) <= 60 else f"{a[:40]}...({len(a)} chars)" for a in argv]
    return f"`python -m {r.cmd} {' '.join(argv)}`"


def doc_rows() -> list[str]:
    """The table's rows for docs/bad-commands.md, each run in a fresh tree of user files."""
    out = []
    for r in ROWS:
        with tempfile.TemporaryDirectory() as tmp:
            make_tree(Path(tmp))
            code, err = run_row(r, Path(tmp))
        message = next((line for line in err.splitlines() if "error:" in line), err.strip())
        cells = (r.what, shown(r), str(code), message)
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out
