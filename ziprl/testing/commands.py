"""The bad-command table (issue 23, item 5): every command's ``main``, bad command lines across them, the small bad
files their argvs name (under ``{d}``), and one row run in this process. ``tests/test_bad_commands.py`` checks each
exits 2 with one ``error:`` line; ``python -m tests.test_bad_commands`` writes docs/bad-commands.md from it."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np

from ziprl import config
from ziprl.boundary import printable
from ziprl.cli import demos, index, launch, sft, train, watch_teacher
from ziprl.cli import eval as eval_cmd
from ziprl.view import command as view

COMMANDS = {"ziprl.launch": launch.main, "ziprl.train": train.main, "ziprl.eval": eval_cmd.main,
            "ziprl.index": index.main, "ziprl.demos": demos.main, "ziprl.sft": sft.main, "ziprl.watch_teacher": watch_teacher.main,
            "ziprl.view": view.main, "ziprl.config": config.main}
D = "{d}"  # the directory of the fixture files below, in each argv
BOMB = "demos:\n  datasets: [&a [l,l,l,l,l,l,l,l,l], " + ", ".join(
    f"&{c} [" + ",".join([f"*{p}"] * 9) + "]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)) + "]\n"
FILES = {  # name -> bytes, written into {d}
    "good.jsonl": b"".join(json.dumps({"id": i, "title": i.upper(), "text": f"text {i}"}).encode() + b"\n"
                           for i in ("a", "b")),
    "malformed.jsonl": b'{"id": "a", "title": "A", "text": "x"}\n{oops\n',
    "empty.jsonl": b"",
    "notext.jsonl": b'{"id": "a", "title": "A"}\n',
    "list.yaml": b"- env\n",
    "scalar.yaml": b"hello\n",
    "tagged.yaml": b"env:\n  max_turns: !!python/object/apply:os.getcwd []\n",
    "bomb.yaml": BOMB.encode(),
    "garbage.yaml": bytes(range(256)),
    "ctrl.yaml": b"env:\n  strategy: \x01\n",
    "unknown.yaml": b"envv:\n  max_turns: 3\n",
    "badfield.yaml": b"env:\n  max_turn: 3\n",
    "badvalue.yaml": b"env:\n  max_turns: many\n",
    "badsection.yaml": b"env: 3\n",
    "notes.txt": b"just text\n",
    "demos.parquet": b"PAR1 not really",
    "vectors.txt": b"1 2 3\n",
    "nested.jsonl": b'{"id": "a", "question": "Who?", "answers": ["Ann"], "x": ' + b"[" * 100_000 + b"]" * 100_000
                    + b"}\n",
    "noscore.jsonl": b'{"id": "a", "question": "Which band?", "answers": ["!!!"]}\n',
    "dup2.jsonl": b'{"id": "a", "title": "A", "text": "x"}\n{"id": "a", "title": "B", "text": "y"}\n',
    "spaceid.jsonl": b'{"id": " a", "title": "A", "text": "x"}\n',
}


def case(cmd: str, what: str, *argv: str) -> tuple[str, str, list[str]]:
    return cmd, what, list(argv)


SETS = [  # (what, --set value): bad overrides every command that takes --set must refuse
    ("YAML syntax error", "env.max_turns=[1"), ("YAML python tag", "env.max_turns=!!python/object/apply:os.getcwd []"),
    ("YAML anchor", "env.max_turns=&a 3"), ("unknown section", "envv.max_turns=3"),
    ("unknown field", "env.max_turnz=3"), ("no '='", "env.max_turns"), ("empty key", "=3"),
    ("wrong type", "env.max_turns=many"), ("bool for int", "env.max_turns=true"), ("list for str", "model.path=[1]"),
    ("out of range", "learner.lr=-1"), ("NaN", "learner.lr=nan"), ("removed key", "ray.queue_size=1"),
]
CONFIGS = [  # (what, --config value)
    ("missing config", f"{D}/nope.yaml"), ("config is a directory", D), ("config is a list", f"{D}/list.yaml"),
    ("config is a scalar", f"{D}/scalar.yaml"), ("config with a python tag", f"{D}/tagged.yaml"),
    ("billion-laughs config", f"{D}/bomb.yaml"), ("binary config", f"{D}/garbage.yaml"),
    ("config with control characters", f"{D}/ctrl.yaml"), ("unknown section in config", f"{D}/unknown.yaml"),
    ("unknown field in config", f"{D}/badfield.yaml"), ("wrong type in config", f"{D}/badvalue.yaml"),
    ("section that is not a mapping", f"{D}/badsection.yaml"),
]
OUT = ["--out", f"{D}/run"]
CASES = [
    *[case("ziprl.config", what, "--show", "--set", value) for what, value in SETS],
    *[case("ziprl.config", what, "--show", "--config", path) for what, path in CONFIGS],
    case("ziprl.config", "--set through a class attribute", "--show", "--set", "__class__.env=1"),
    case("ziprl.config", "no --show", "--config", f"{D}/nope.yaml"),
    case("ziprl.config", "unknown flag", "--show", "--bogus"),
    *[case("ziprl.eval", what, "--set", value) for what, value in SETS],
    *[case("ziprl.eval", what, "--config", path) for what, path in CONFIGS],
    case("ziprl.eval", "unknown strategy", "--strategy", "magic"),
    case("ziprl.eval", "empty strategy list", "--strategy", ","),
    case("ziprl.eval", "--max-turns not a number", "--max-turns", "x"),
    case("ziprl.eval", "--max-turns 0", "--max-turns", "0"),
    case("ziprl.eval", "--top-k 0", "--top-k", "0"),
    case("ziprl.eval", "--limit 0", "--limit", "0"),
    case("ziprl.eval", "--samples 0", "--samples", "0"),
    case("ziprl.eval", "--seed not a number", "--seed", "1.5"),
    case("ziprl.eval", "unknown dataset", "--dataset", "nosuchset"),
    case("ziprl.eval", "missing dataset file", "--dataset", f"{D}/nope.jsonl"),
    case("ziprl.eval", "dataset is a directory", "--dataset", D),
    case("ziprl.eval", "missing model", "--model", f"{D}/nomodel"),
    case("ziprl.eval", "model is a file", "--model", f"{D}/notes.txt"),
    case("ziprl.eval", "--out is a file", "--out", f"{D}/notes.txt"),
    case("ziprl.eval", "--out under a file", "--out", f"{D}/notes.txt/sub"),
    case("ziprl.eval", "--noise not numbers", "--noise", "a,b"),
    case("ziprl.eval", "--noise above 1", "--noise", "0,1.5"),
    case("ziprl.eval", "--noise negative", "--noise", "-0.5"),
    case("ziprl.eval", "--noise empty", "--noise", ","),
    case("ziprl.eval", "--noise NaN", "--noise", "nan"),
    case("ziprl.eval", "--noise with a bad strategy", "--noise", "0,0.5", "--strategy", "magic"),
    case("ziprl.eval", "malformed corpus", "--set", f"retriever.corpus={D}/malformed.jsonl"),
    case("ziprl.eval", "corpus without text", "--set", f"retriever.corpus={D}/notext.jsonl"),
    case("ziprl.eval", "missing corpus", "--set", f"retriever.corpus={D}/nope.jsonl"),
    case("ziprl.eval", "missing index_dir", "--set", f"retriever.index_dir={D}/noindex"),
    case("ziprl.eval", "question file nested too deeply", "--dataset", f"{D}/nested.jsonl"),
    case("ziprl.eval", "answer nothing can match", "--dataset", f"{D}/noscore.jsonl"),
    case("ziprl.eval", "corpus with a duplicate id on line 2", "--set", f"retriever.corpus={D}/dup2.jsonl"),
    case("ziprl.eval", "corpus id the agent cannot write", "--set", f"retriever.corpus={D}/spaceid.jsonl"),
    case("ziprl.eval", "corpus smaller than env.top_k", "--set", f"retriever.corpus={D}/good.jsonl"),
    case("ziprl.eval", "unknown flag", "--bogus"),
    *[case("ziprl.train", what, *OUT, "--set", value) for what, value in SETS[:8]],
    *[case("ziprl.train", what, *OUT, "--config", path) for what, path in CONFIGS[:6]],
    case("ziprl.train", "--steps not a number", *OUT, "--steps", "two"),
    case("ziprl.train", "--steps 0", *OUT, "--steps", "0"),
    case("ziprl.train", "--resume and --overwrite", *OUT, "--resume", "--overwrite"),
    case("ziprl.train", "--resume with nothing to resume", *OUT, "--resume"),
    case("ziprl.train", "--out is a file", "--out", f"{D}/notes.txt"),
    case("ziprl.train", "missing --sft-checkpoint", *OUT, "--sft-checkpoint", f"{D}/nosft"),
    case("ziprl.train", "--sft-checkpoint is a file", *OUT, "--sft-checkpoint", f"{D}/notes.txt"),
    case("ziprl.train", "empty corpus", *OUT, "--set", f"retriever.corpus={D}/empty.jsonl"),
    case("ziprl.train", "missing dataset", *OUT, "--set", f"data.dataset={D}/nope.jsonl"),
    case("ziprl.train", "corpus with a duplicate id on line 2", *OUT, "--set", f"retriever.corpus={D}/dup2.jsonl"),
    case("ziprl.train", "unknown flag", "--bogus"),
    *[case("ziprl.launch", what, *OUT, "--set", value) for what, value in SETS[:6]],
    *[case("ziprl.launch", what, *OUT, "--config", path) for what, path in CONFIGS[:6]],
    case("ziprl.launch", "--num-rollout-actors 0", *OUT, "--num-rollout-actors", "0"),
    case("ziprl.launch", "--num-rollout-actors not a number", *OUT, "--num-rollout-actors", "x"),
    case("ziprl.launch", "--steps -1", *OUT, "--steps", "-1"),
    case("ziprl.launch", "--resume and --overwrite", *OUT, "--resume", "--overwrite"),
    case("ziprl.launch", "--out is a file", "--out", f"{D}/notes.txt"),
    case("ziprl.launch", "missing --sft-checkpoint", *OUT, "--sft-checkpoint", f"{D}/nosft"),
    case("ziprl.launch", "public HTTP route without a token", *OUT, "--set", "ray.http_port=8000", "--set",
         "ray.http_host=0.0.0.0"),
    case("ziprl.launch", "vLLM on CPU", *OUT, "--set", "model.engine=vllm", "--set", "model.device=cpu"),
    case("ziprl.launch", "missing dataset", *OUT, "--set", f"data.dataset={D}/nope.jsonl"),
    *[case("ziprl.demos", what, "--set", value) for what, value in SETS[:6]],
    *[case("ziprl.demos", what, "--config", path) for what, path in CONFIGS[:6]],
    case("ziprl.demos", "--limit -1", "--limit", "-1"),
    case("ziprl.demos", "--limit not a number", "--limit", "x"),
    case("ziprl.demos", "unknown dataset", "--datasets", "nosuchset"),
    case("ziprl.demos", "missing dataset file", "--datasets", f"{D}/nope.jsonl"),
    case("ziprl.demos", "malformed corpus", "--set", f"retriever.corpus={D}/malformed.jsonl"),
    case("ziprl.demos", "--out is a directory", "--out", D),
    case("ziprl.demos", "--out under a file", "--out", f"{D}/notes.txt/demos.parquet"),
    case("ziprl.demos", "--resume and --overwrite", "--out", f"{D}/new.parquet", "--resume", "--overwrite"),
    case("ziprl.demos", "--resume with nothing to resume", "--out", f"{D}/new.parquet", "--resume"),
    *[case("ziprl.sft", what, "--demos", f"{D}/demos.parquet", "--out", f"{D}/sft", "--set", value)
      for what, value in SETS[:6]],
    *[case("ziprl.sft", what, "--demos", f"{D}/demos.parquet", "--out", f"{D}/sft", "--config", path)
      for what, path in CONFIGS[:4]],
    case("ziprl.sft", "no --demos", "--out", f"{D}/sft"),
    case("ziprl.sft", "no --out", "--demos", f"{D}/demos.parquet"),
    case("ziprl.sft", "missing demos file", "--demos", f"{D}/nope.parquet", "--out", f"{D}/sft"),
    case("ziprl.sft", "demos file is a directory", "--demos", D, "--out", f"{D}/sft"),
    case("ziprl.sft", "demos file is not Parquet", "--demos", f"{D}/demos.parquet", "--out", f"{D}/sft"),
    case("ziprl.sft", "demos file is text", "--demos", f"{D}/notes.txt", "--out", f"{D}/sft"),
    case("ziprl.watch_teacher", "unknown strategy", "--strategy", "magic"),
    case("ziprl.watch_teacher", "--episodes not a number", "--episodes", "x"),
    case("ziprl.watch_teacher", "--episodes -1", "--episodes", "-1"),
    case("ziprl.watch_teacher", "--level-scale 0", "--level-scale", "0"),
    case("ziprl.watch_teacher", "--level-scale NaN", "--level-scale", "nan"),
    case("ziprl.watch_teacher", "--level-scale not a number", "--level-scale", "big"),
    case("ziprl.watch_teacher", "--seed not a number", "--seed", "x"),
    case("ziprl.watch_teacher", "--seed negative", "--seed", "-1"),
    case("ziprl.watch_teacher", "unknown flag", "--bogus"),
    case("ziprl.index", "no subcommand"),
    case("ziprl.index", "unknown subcommand", "rebuild"),
    case("ziprl.index", "build without --corpus", "build", "--out", f"{D}/idx"),
    case("ziprl.index", "build without --out", "build", "--corpus", f"{D}/good.jsonl"),
    case("ziprl.index", "build missing corpus", "build", "--corpus", f"{D}/nope.jsonl", "--out", f"{D}/idx"),
    case("ziprl.index", "build corpus is a directory", "build", "--corpus", D, "--out", f"{D}/idx"),
    case("ziprl.index", "build malformed corpus", "build", "--corpus", f"{D}/malformed.jsonl", "--out", f"{D}/idx"),
    case("ziprl.index", "build empty corpus", "build", "--corpus", f"{D}/empty.jsonl", "--out", f"{D}/idx"),
    case("ziprl.index", "build corpus without text", "build", "--corpus", f"{D}/notext.jsonl", "--out", f"{D}/idx"),
    case("ziprl.index", "build --out is a file", "build", "--corpus", f"{D}/good.jsonl", "--out", f"{D}/notes.txt"),
    case("ziprl.index", "build --out is a non-index directory", "build", "--corpus", f"{D}/good.jsonl", "--out", D),
    case("ziprl.index", "build empty --index", "build", "--corpus", f"{D}/good.jsonl", "--out", f"{D}/idx",
         "--index", " "),
    case("ziprl.index", "build --shards 0", "build", "--corpus", f"{D}/good.jsonl", "--out", f"{D}/idx",
         "--shards", "0"),
    case("ziprl.index", "build --shards above corpus size", "build", "--corpus", f"{D}/good.jsonl", "--out",
         f"{D}/idx", "--shards", "3"),
    case("ziprl.index", "build --chunk-size 0", "build", "--corpus", f"{D}/good.jsonl", "--out", f"{D}/idx",
         "--chunk-size", "0"),
    case("ziprl.index", "build --train-size 0", "build", "--corpus", f"{D}/good.jsonl", "--out", f"{D}/idx",
         "--train-size", "0"),
    case("ziprl.index", "build --batch-size 0", "build", "--corpus", f"{D}/good.jsonl", "--out", f"{D}/idx",
         "--batch-size", "0"),
    case("ziprl.index", "build --batch-size not a number", "build", "--corpus", f"{D}/good.jsonl", "--out",
         f"{D}/idx", "--batch-size", "x"),
    case("ziprl.index", "build missing embeddings", "build", "--corpus", f"{D}/good.jsonl", "--out", f"{D}/idx",
         "--embeddings", f"{D}/nope.npy"),
    case("ziprl.index", "build embeddings of the wrong type", "build", "--corpus", f"{D}/good.jsonl", "--out",
         f"{D}/idx", "--embeddings", f"{D}/vectors.txt"),
    case("ziprl.index", "build embeddings not .npy inside", "build", "--corpus", f"{D}/good.jsonl", "--out",
         f"{D}/idx", "--embeddings", f"{D}/fake.npy"),
    case("ziprl.index", "build 1-D embeddings", "build", "--corpus", f"{D}/good.jsonl", "--out", f"{D}/idx",
         "--embeddings", f"{D}/flat.npy"),
    case("ziprl.index", "build integer embeddings", "build", "--corpus", f"{D}/good.jsonl", "--out", f"{D}/idx",
         "--embeddings", f"{D}/ints.npy"),
    case("ziprl.index", "build embeddings with too few rows", "build", "--corpus", f"{D}/good.jsonl", "--out",
         f"{D}/idx", "--embeddings", f"{D}/one.npy"),
    case("ziprl.index", "build embeddings not Parquet inside", "build", "--corpus", f"{D}/good.jsonl", "--out",
         f"{D}/idx", "--embeddings", f"{D}/demos.parquet"),
    case("ziprl.index", "adopt missing FAISS file", "adopt", "--faiss", f"{D}/nope.faiss", "--corpus",
         f"{D}/good.jsonl", "--out", f"{D}/idx"),
    case("ziprl.index", "adopt a non-FAISS file", "adopt", "--faiss", f"{D}/notes.txt", "--corpus",
         f"{D}/good.jsonl", "--out", f"{D}/idx"),
    case("ziprl.index", "adopt --out is a file", "adopt", "--faiss", f"{D}/notes.txt", "--corpus",
         f"{D}/good.jsonl", "--out", f"{D}/notes.txt"),
    case("ziprl.index", "adopt without --faiss", "adopt", "--corpus", f"{D}/good.jsonl", "--out", f"{D}/idx"),
    case("ziprl.index", "search missing index", "search", "--index", f"{D}/noindex", "q"),
    case("ziprl.index", "search index is a file", "search", "--index", f"{D}/notes.txt", "q"),
    case("ziprl.index", "search non-index directory", "search", "--index", D, "q"),
    case("ziprl.index", "search -k not a number", "search", "--index", f"{D}/noindex", "-k", "x", "q"),
    case("ziprl.index", "search without a query", "search", "--index", f"{D}/noindex"),
    case("ziprl.index", "search --nprobe negative", "search", "--index", f"{D}/noindex", "--nprobe", "-1", "q"),
    case("ziprl.index", "search --ef-search negative", "search", "--index", f"{D}/noindex", "--ef-search", "-3", "q"),
    case("ziprl.index", "search --k-factor negative", "search", "--index", f"{D}/noindex", "--k-factor", "-1", "q"),
    case("ziprl.index", "search a query that is not UTF-8", "search", "--index", f"{D}/noindex", "q\udcff"),
    case("ziprl.index", "build into a path that is not UTF-8", "build", "--corpus", f"{D}/good.jsonl", "--out",
         f"{D}/\udcffidx"),
    case("ziprl.index", "open missing index", "open", "--index", f"{D}/noindex", "doc-1"),
    case("ziprl.view", "missing run directory", f"{D}/norun"),
    case("ziprl.view", "not a trajectory file", f"{D}/notes.txt"),
    case("ziprl.view", "directory without trajectories", D),
    case("ziprl.view", "--port out of range", f"{D}/norun", "--port", "70000"),
    case("ziprl.view", "--port not a number", f"{D}/norun", "--port", "x"),
    case("ziprl.view", "no path"),
]


def make_files(d: Path) -> None:
    """The fixture files the table's argvs name, in ``d``."""
    for name, data in FILES.items():
        (d / name).write_bytes(data)
    (d / "fake.npy").write_bytes(b"not numpy")
    np.save(d / "flat.npy", np.zeros(384, np.float32))
    np.save(d / "ints.npy", np.zeros((2, 384), np.int32))
    np.save(d / "one.npy", np.zeros((1, 384), np.float32))


def run_case(cmd: str, argv: list[str], d: Path) -> tuple[int, str]:
    """Run one table row in this process; (exit code, stderr). argparse's SystemExit is its exit code."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = COMMANDS[cmd]([a.replace(D, str(d)) for a in argv])
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue().replace(str(d), "DIR")


def shown(cmd: str, argv: list[str]) -> str:
    """The command line as the doc shows it: DIR for the fixture directory, bytes that are not UTF-8 as ``\\xNN``."""
    return f"`python -m {cmd} {' '.join(map(printable, argv))}`".replace(D, "DIR")
