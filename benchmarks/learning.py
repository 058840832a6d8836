"""Does ZipRL learn? Stage 1, then GRPO + HRR, evaluated on held-out questions (issues 21 and 47).

    python benchmarks/learning.py [--task invented|real] [--quick] [--config FILE] [--seeds 0,1,2] [--weights 0,0.2]
                                  [--steps N] [--demos N] [--set SECTION.FIELD=VALUE ...]
                                  [--eval-every K] [--eval-limit 100] [--eval-samples 2 | --greedy]
                                  [--out runs/learning-<task>] [--workers 2] [--name learning_<task>[_quick]]

Questions (``--task``), each task over its own corpus:
- ``invented`` (configs/learn-invented.yaml): training questions of the registered dataset ``invented``; held out,
  ``invented-heldout``: questions about invented entities no training question names;
- ``real`` (configs/learn-cpu.yaml): training HotpotQA train (100) + MuSiQue train (100) + HotpotQA
  dev-distractor questions 0-199; held out, dev-distractor questions 200-299; over the pooled corpus (6,850).

Stage 1: the scripted teacher plays the config's ``demos.datasets``, the kept episodes are the SFT data, cached by
configuration and demonstration data (``ziprl.learner.sft.stage1_dir``); the weights' sha256 is written beside
the model and checked whenever the cache is reused. RL: ``ziprl.train`` from the Stage-1 model for each seed, with
w = 0 (plain GRPO) and w = 0.2 (HRR), the same number of steps (equal update counts) on the same question order
and sampling seeds (paired); ``--weights`` adds arms (e.g. ``0,0.2,1``: how Q_com follows HRR's share), each
compared with w = 0. ``--quick`` (the main effect, sized for 40 minutes on 2 cores): Stage 1 from 100 demonstration
episodes, seed 0 and w = 0.2 only, 3 steps, one greedy sample per held-out question, evaluated at its last step;
each default can still be given (``--demos``, ``--steps``, ``--eval-samples``), and its runs go to their own ``--out``.
``--set`` changes the config for Stage 1, the runs and the evaluations alike (e.g. ``learner.hrr_reference=causal``:
HRR against the mean of the turns so far), except the settings the benchmark gives each run, which are refused.

Evaluation: Stage 1 and every ``--eval-every``-th checkpoint on the first ``--eval-limit`` held-out questions,
adaptive strategy, ``--eval-samples`` seeded samples per question (``--greedy``: one greedy sample); each records
the sha256 of the weights it evaluated and is redone when they, the questions or the settings change. Reports
after - Stage 1 and w - (w = 0) with 95% intervals of a bootstrap over seeds, questions and samples
(benchmarks/learning_stats.py), held-out F1 against step with intervals (PNG; TensorBoard under each run's
``tb/`` and ``<out>/tb/w<w>``), the training curves, and issue 47's goals with whether each is met: JSON +
markdown under benchmarks/results/, each headed by commit, command, config, machine and date. Finished runs and
evaluations under ``--out`` are read, not redone; a run that stopped short (interrupted, or run with fewer
``--steps``) continues from its last checkpoint; a run trained with other settings is refused, naming them
(settings that train alike, :func:`trains_alike`, are not other settings; its input files are compared by the bytes
recorded in ``<out>/inputs/``, so a moved ``--out`` still matches).

Work runs in ``--workers`` processes of one torch thread each (the Stage-1 evaluation beside the RL runs, each
run's checkpoints evaluated as soon as it finishes): on 2 cores two one-thread processes get more done than one two-thread process, since
batch-8 decoding does not scale to a second thread (measured: 50 vs 85 tokens/s for 1 vs 2 threads). A job that
starts when no other can run beside it (the last evaluation) gets ``--workers`` threads. Each process's output goes
to ``<out>/logs/``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    RESULTS,
    at_least,
    check_plots,
    in_work_dir,
    listed,
    model_dir,
    portable,
    results_name,
    write_results,
)
from learning_stats import Interval, bootstrap, goal_rows, interval_row  # noqa: E402

from ziprl.boundary import UserError, one_line  # noqa: E402
from ziprl.config import load_config  # noqa: E402
from ziprl.outputs import locked  # noqa: E402
from ziprl.paths import atomic_write_json, file_sha256, not_a_file  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HELD_OUT = range(200, 300)  # HotpotQA dev-distractor questions kept for evaluation (task ``real``)
TASKS = {"invented": REPO / "configs" / "learn-invented.yaml", "real": REPO / "configs" / "learn-cpu.yaml"}
RECIPE = 0.2  # HRR's w in the default recipe, the arm issue 47's goals judge
WEIGHTS, QUICK_WEIGHTS = (0.0, RECIPE), (RECIPE,)  # w = 0 (GRPO) beside it
QUICK_DEMOS, QUICK_STEPS = 100, 3  # --quick: Stage 1 from this many demonstration episodes, RL steps
EVAL_METRICS = ("f1", "em", "format_error_rate", "turns", "searches", "tokens_per_trajectory", "q_com")
SAMPLE_METRICS = ("f1", "em", "q_com", "format_error_rate")  # kept per sample in the results (per_sample)
TRAIN_METRICS = {"reward": "rollout/reward", "em (pass rate)": "rollout/em", "q_com": "rollout/q_com",
                 "format_error_rate": "rollout/format_error_rate", "zero_variance_frac": "learner/zero_variance_frac",
                 "zero_variance_frac_sampled": "rollout/zero_variance_frac_sampled",
                 "dlogp_pos_adv": "learner/dlogp_pos_adv", "dlogp_neg_adv": "learner/dlogp_neg_adv",
                 "adv_std": "learner/adv_std", "hrr_abs_mean": "learner/hrr_abs_mean",  # HRR's share of the signal
                 "step_seconds": "perf/step_seconds"}


OWNED = {"learner.hrr_weight": "--weights", "learner.seed": "--seeds", "data.seed": "--seeds",  # set per run/eval
         "learner.steps": "--steps", "demos.limit": "--demos", "run.checkpoint_every": "--eval-every",
         "sampling.greedy": "--greedy", "rollout.group_size": "--eval-samples", "run.sft_checkpoint": "--stage1-model",
         **dict.fromkeys(("data.dataset", "retriever.corpus"), "--task"),
         **dict.fromkeys(("run.keep_checkpoints", "run.out_dir", "run.resume", "rollout.dynamic_sampling",
                          "model.path", "model.num_threads"), "")}
RESULT_PARTS = ("goals", "heldout", "diff", "curve", "train")  # the results files: <name>_<part>.json and .md
TRAIN_PLOTS = (("reward", "_reward"), ("q_com", "_qcom"), ("zero_variance_frac", "_zero_variance"))  # metric, suffix
PLOT_SUFFIXES = (*(suffix for _, suffix in TRAIN_PLOTS), "_heldout_f1")  # its plots: <name><suffix>.png
EVAL_SECTIONS = ("env", "retriever", "model", "sampling", "data", "rollout")  # what a held-out evaluation reads
CONTINUABLE = {"learner.steps", "run.checkpoint_every", "run.resume", "run.out_dir",  # may differ when a run goes on
               "model.num_threads"}


def log(msg: str) -> None:
    print(f"[learning {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stage1(config: Path | None, overrides: list[str]) -> Path:
    """The Stage-1 model for these settings (cached under ``stage1_dir``), built if missing; its weights' sha256 is
    written beside it the first time and checked on every reuse."""
    from ziprl.env.demos import build_demos
    from ziprl.learner.sft import check_weights, run_sft, stage1_dir, stage1_resumable

    cfg = load_config(config, overrides)
    root = stage1_dir(cfg)
    with locked(root, wait=True):
        if not (root / "model" / "config.json").is_file():
            cfg.demos.out = str(root / "demos.parquet")
            resume = stage1_resumable(root)  # an SFT a stopped build left continues from its checkpoint
            if resume:
                demos = root / "demos.parquet"
                log(f"Stage 1: continuing the SFT in {root}")
            else:
                demos, counts = build_demos(cfg)
                atomic_write_json(root / "demos_counts.json", counts)
                log(f"Stage 1: {counts['kept']} kept demo episodes of {counts['episodes']}, {counts['transitions']} "
                    "transitions; SFT")
            t0 = time.perf_counter()
            run_sft(cfg, demos, root, resume=resume)
            atomic_write_json(root / "sft_seconds.json", {"seconds": time.perf_counter() - t0})
        check_weights(root / "model")
    return root / "model"


# ------------------------------------------------------------------ questions


def task_questions(task: str) -> tuple[list, list]:
    """The training and the held-out questions of ``task`` (loaded and checked; nothing is written)."""
    from ziprl.retrieval.datasets import load_dataset

    if task == "real":
        pooled = load_dataset("pooled")
        dev = [ex for ex in pooled if ex.source == "hotpotqa-dev-distractor"]
        return pooled, [dev[i] for i in HELD_OUT]
    return load_dataset("invented"), load_dataset("invented-heldout")


def split_questions(task: str, out: Path, eval_limit: int) -> tuple[Path, Path, Path]:
    """Training and held-out question files of ``task`` under ``out`` (unified JSONL; no held-out id or question
    text among the training ones), and the corpus both search."""
    from ziprl.retrieval.datasets import corpus_for, write_qa_jsonl

    train, held_out = task_questions(task)
    corpus = corpus_for("pooled" if task == "real" else "invented")
    if eval_limit > len(held_out):
        raise SystemExit(f"--eval-limit {eval_limit}: task {task} holds {len(held_out)} held-out questions")
    held_out = held_out[:eval_limit]
    held_ids, held_text = {ex.id for ex in held_out}, {ex.question for ex in held_out}
    train = [ex for ex in train if ex.id not in held_ids and ex.question not in held_text]
    out.mkdir(parents=True, exist_ok=True)
    return write_qa_jsonl(train, out / "train.jsonl"), write_qa_jsonl(held_out, out / "heldout.jsonl"), corpus


def check_demos_disjoint(model: Path, held_out: Path) -> int:
    """Number of demonstration questions; raises if any demonstration was played on a held-out question."""
    import pyarrow.parquet as pq

    from ziprl.retrieval.datasets import load_qa_jsonl

    demos = model.parent / "demos.parquet"
    if not demos.is_file():  # a Stage-1 model given by --stage1-model: its demonstrations are not known
        return 0
    ids = set(pq.read_table(demos, columns=["question_id"]).column(0).to_pylist())
    leaked = ids & {ex.id for ex in load_qa_jsonl(held_out)}
    if leaked:
        raise SystemExit(f"demonstrations played held-out questions: {sorted(leaked)[:5]}")
    return len(ids)


# ------------------------------------------------------------------ processes


def rl_command(config: Path, overrides: list[str], run_dir: Path, threads: int = 1) -> list[str] | None:
    """The ``ziprl.train`` command of one RL run on ``threads`` torch threads, or None when it finished earlier under
    the same directory. A run that stopped short (interrupted, or run with fewer ``--steps``) continues from its last
    checkpoint; one that left no checkpoint starts over. The bytes of the run's input files are recorded the first
    time (:func:`record_inputs`)."""
    overrides = [*overrides, f"model.num_threads={threads}"]
    cfg = load_config(config, overrides)
    changed = settings_changed(run_dir, cfg.to_dict())
    if changed:
        raise SystemExit(f"error: {run_dir} was trained with other settings ({', '.join(changed)}); pass another "
                         "--out, or delete that run to train it again")
    record_inputs(run_dir, cfg.to_dict())
    if len(read_metrics(run_dir)) >= cfg.learner.steps:
        return None
    if not (run_dir / ".ziprl-run").is_file():
        resume = []
    elif (run_dir / "checkpoints" / "latest").is_file():
        resume = ["--resume"]
    else:  # it stopped before its first checkpoint
        resume = ["--overwrite"]
    return [sys.executable, "-m", "ziprl.train", "--config", str(config), "--out", str(run_dir), *resume,
            *[a for o in overrides for a in ("--set", o)]]


def settings_changed(run_dir: Path, config: dict) -> list[str]:
    """The settings (``section.field``) in which ``config`` differs from the ``config.json`` the run was started with,
    other than those a continued run may change (none when the run recorded no configuration). A field the run did
    not record was added to ZipRL since: the run could not set it, so it is no difference."""
    path = run_dir / "config.json"
    if not path.is_file():
        return []
    ran, config = json.loads(path.read_text(encoding="utf-8")), json.loads(json.dumps(config))  # tuples as lists
    record = inputs_record(run_dir)
    digests = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else {}
    return [f"{section}.{key}" for section, fields in config.items() for key, value in fields.items()
            if f"{section}.{key}" not in CONTINUABLE and key in ran.get(section, {})
            and not trains_alike(f"{section}.{key}", ran[section][key], value, config, digests)]


def trains_alike(setting: str, ran: object, value: object, config: dict, digests: dict[str, str] | None = None) -> bool:
    """Whether a run started with ``setting`` = ``ran`` trains as one with ``value`` under ``config``: a setting whose
    file's bytes the run recorded (``digests``, by setting) names a file with those bytes, wherever it is now (the
    run's ``--out`` may have moved); else the values are equal, or they name two files with the same bytes (another
    ``--out``'s question file), or they are dynamic sampling by reward and by advantage at w = 0, which keep the
    same groups."""
    if digests and setting in digests:
        return isinstance(value, str) and is_file(value) and file_sha256(value) == digests[setting]
    if ran == value or (isinstance(ran, str) and isinstance(value, str) and same_file(Path(ran), Path(value))):
        return True
    return (setting == "rollout.dynamic_sampling_metric" and {ran, value} == {"reward", "advantage"}
            and config["learner"]["hrr_weight"] == 0)


def inputs_record(run_dir: Path) -> Path:
    """Where the sha256 of run ``run_dir``'s input files is kept: beside the run, in the benchmark's ``--out``."""
    return run_dir.parent / "inputs" / f"{run_dir.name}.json"


def record_inputs(run_dir: Path, config: dict) -> None:
    """Record the sha256 of each file a setting of the run names by an absolute path (a relative one, or a word such
    as a strategy's name, depends on the working directory): at the first check of a started run (the settings its
    ``config.json`` holds), afresh while it is not started (``config``). :func:`settings_changed` then compares those
    files by their bytes, even once their paths are gone."""
    record, started = inputs_record(run_dir), run_dir / "config.json"
    if record.is_file() and started.is_file():
        return
    ran = json.loads(started.read_text(encoding="utf-8")) if started.is_file() else config
    digests = {f"{section}.{key}": file_sha256(value) for section, fields in ran.items()
               for key, value in fields.items()
               if isinstance(value, str) and Path(value).is_absolute() and is_file(value)}
    record.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(record, digests)


def is_file(value: str) -> bool:
    """Whether ``value`` names a regular file (a value that is no path this system can stat is none)."""
    return bool(value) and not_a_file(value) is None


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are both files with the same bytes."""
    return (is_file(str(a)) and is_file(str(b)) and a.stat().st_size == b.stat().st_size
            and file_sha256(a) == file_sha256(b))


@dataclass(frozen=True)
class Job:
    """One process of the benchmark: ``command(threads)`` is built when the job starts, for the torch threads it gets
    (None: nothing left to do), once every job named in ``after`` has finished."""

    name: str
    command: Callable[[int], list[str] | None]
    after: tuple[str, ...] = ()


def run_parallel(jobs: list[Job], workers: int, logs: Path) -> None:
    """Run the jobs, ``workers`` at a time, each as soon as those it comes after are done (in list order among the
    ready ones); raise if any fails (jobs after a failed one do not run). A job gets one torch thread, or ``workers``
    when it starts alone with no other ready: then none can start beside it before it ends. A ready job with nothing
    left to do (its command is None) is done at once and does not count as one that could run beside another."""
    import subprocess

    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    logs.mkdir(parents=True, exist_ok=True)
    pending, running, done, failed = list(jobs), [], set(), []
    while pending or running:
        for job in [j for j in pending if set(j.after) & set(failed)]:
            pending.remove(job)
            failed.append(job.name)
        while len(running) < workers and (ready := [j for j in pending if set(j.after) <= done]):
            if idle := [j for j in ready if j.command(1) is None]:  # finished earlier
                for job in idle:
                    pending.remove(job)
                    done.add(job.name)
                continue
            job, threads = ready[0], workers if not running and len(ready) == 1 else 1
            pending.remove(job)
            cmd = job.command(threads)
            log(f"start {job.name} on {threads} thread(s) (log: {logs / job.name}.log)")
            with open(logs / f"{job.name}.log", "w") as out:
                running.append((job.name, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env
                                                           | {"OMP_NUM_THREADS": str(threads),
                                                              "MKL_NUM_THREADS": str(threads)})))
        if not running:
            if pending:  # nothing runs and nothing can start: they wait on jobs not in the list
                raise SystemExit(f"jobs wait on jobs that are not given: {', '.join(j.name for j in pending)}")
            continue
        time.sleep(2)
        for name, proc in [r for r in running if r[1].poll() is not None]:
            running.remove((name, proc))
            log(f"{name} finished (exit {proc.returncode})")
            (failed.append if proc.returncode else done.add)(name)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}; see {logs}")


def read_metrics(run_dir: Path) -> list[dict]:
    from ziprl.loop.summary import step_rows

    path = run_dir / "metrics.jsonl"
    return step_rows(path.read_text(encoding="utf-8").splitlines()) if path.is_file() else []


def checkpoint_model(run_dir: Path, step: int, base: Path) -> Path:
    """The HF model directory of the run's checkpoint at ``step`` (exported once, beside the run)."""
    from ziprl.learner.checkpoint import export_model

    out = run_dir.parent / "models" / f"{run_dir.name}_step{step}"
    if (out / "config.json").is_file():
        return out
    found = sorted((run_dir / "checkpoints").glob(f"step_{step}-*"))
    if not found:
        raise SystemExit(f"{run_dir} has no checkpoint of step {step} (it ran with another --eval-every; delete it "
                         "to run it again)")
    return export_model(found[-1], base, out)


# ------------------------------------------------------------------ evaluation


@dataclass(frozen=True)
class EvalSpec:
    """What every held-out evaluation of one benchmark run shares."""

    config: Path
    held_out: Path
    corpus: Path
    samples: int
    greedy: bool
    overrides: tuple[str, ...] = ()  # --set

    def settings(self, model: Path) -> dict:
        """What an evaluation of ``model`` is valid for: the weights, the questions, the sampling and the config
        sections evaluation reads (another learner setting leaves a Stage-1 evaluation valid)."""
        from ziprl.learner.sft import weights_sha256

        resolved = load_config(self.config, list(self.overrides)).to_dict()
        config = json.dumps({k: resolved[k] for k in EVAL_SECTIONS}, sort_keys=True, default=str)
        return {"weights_sha256": weights_sha256(model), "held_out_sha256": file_sha256(self.held_out),
                "eval_config_sha256": hashlib.sha256(config.encode()).hexdigest(), "samples": self.samples,
                "greedy": self.greedy}

    def command(self, model: Path, cache: Path, threads: int = 1) -> list[str]:
        """The worker process that evaluates ``model`` into ``cache`` on ``threads`` torch threads (:func:`evaluate`)."""
        job = json.dumps(asdict(self) | {"model": model, "cache": cache, "threads": threads}, default=str)
        return [sys.executable, str(Path(__file__).resolve()), "--eval-one", job]


def evaluate(spec: EvalSpec, model: Path, cache: Path, threads: int = 1) -> dict:
    """Held-out evaluation of one model (adaptive strategy, ``spec.samples`` seeded samples per question, or one
    greedy one) on ``threads`` torch threads, written to ``cache``: overall stats and one record per sample."""
    from ziprl.env.stats import trajectory_stats
    from ziprl.evaluation.harness import load_eval_setup, run_strategy

    cfg = load_config(spec.config, [*spec.overrides, f"model.path={model}", f"data.dataset={spec.held_out}",
                                    f"retriever.corpus={spec.corpus}", f"rollout.group_size={spec.samples}",
                                    "rollout.dynamic_sampling=false", f"sampling.greedy={str(spec.greedy).lower()}", "data.seed=0",
                                    f"model.num_threads={threads}"])
    log(f"evaluating {model} on {spec.held_out.name} ({spec.samples} sample(s) per question)")
    stats, trajs = run_strategy(cfg, "adaptive", load_eval_setup(cfg), progress=True)
    result = {"model": portable(model), "settings": spec.settings(model), "stats": stats,
              "per_sample": [{"id": t.question_id, "sample": t.sample_index} | trajectory_stats([t]) for t in trajs]}
    atomic_write_json(cache, result)
    log(f"  F1 {stats['f1']:.3f} EM {stats['em']:.3f} format errors/turn {stats['format_error_rate']:.3f} "
        f"({stats['seconds']:.0f} s)")
    return result


def eval_command(spec: EvalSpec, model: Path, cache: Path, threads: int = 1) -> list[str] | None:
    """The evaluation of ``model`` into ``cache`` on ``threads`` torch threads, or None when ``cache`` holds one for
    the same settings."""
    if cache.is_file() and json.loads(cache.read_text()).get("settings") == spec.settings(model):
        return None
    return spec.command(model, cache, threads)


# ------------------------------------------------------------------ statistics


def scores(result: dict, metric: str, ids: list[str]) -> np.ndarray:
    """(questions, samples) array of ``metric``, questions in the order of ``ids``, samples by index."""
    by_id: dict[str, list[tuple[int, float]]] = {}
    for r in result["per_sample"]:
        by_id.setdefault(r["id"], []).append((r["sample"], r.get(metric, 0.0)))
    return np.array([[v for _, v in sorted(by_id[q])] for q in ids], dtype=float)


def arm(evals: dict[str, dict], keys: list[str], metric: str) -> np.ndarray:
    """(seeds, questions, samples) array of ``metric`` over the evaluations ``keys`` (one per seed)."""
    ids = list(dict.fromkeys(r["id"] for r in evals["stage1"]["per_sample"]))
    return np.stack([scores(evals[k], metric, ids) for k in keys])


def eval_key(w: float, seed: int, step: int) -> str:
    """The name of the evaluation of run (w, seed) at ``step``."""
    return f"w{w:g}_seed{seed}_step{step}"


def arm_at(evals: dict[str, dict], w: float, seeds: list[int], step: int, metric: str) -> np.ndarray:
    """:func:`arm` of the runs with weight ``w``, one per seed, evaluated at ``step``."""
    return arm(evals, [eval_key(w, s, step) for s in seeds], metric)


def estimates(evals: dict[str, dict], meta: dict) -> dict[tuple, Interval]:
    """Every comparison, per metric: ``("gain", w, metric, seed | None)`` (the last step - Stage 1, seeds pooled or
    one seed) and ``("vs-grpo", w, metric, step)`` (w - (w = 0) at each evaluated step, paired by seed and question)."""
    seeds, steps, weights = meta["seeds"], meta["steps"], meta["weights"]
    out: dict[tuple, Interval] = {}
    for metric in EVAL_METRICS:
        before = arm(evals, ["stage1"], metric)
        after = {w: arm_at(evals, w, seeds, steps, metric) for w in weights}
        for w in weights:
            out["gain", w, metric, None] = bootstrap(after[w], before)
            for i, s in enumerate(seeds):
                out["gain", w, metric, s] = bootstrap(after[w][i:i + 1], before)
        for k in meta["eval_steps"][1:] if 0.0 in weights else ():  # paired with GRPO at every evaluated step
            grpo = arm_at(evals, 0.0, seeds, k, metric)
            for w in weights:
                if w:
                    out["vs-grpo", w, metric, k] = bootstrap(arm_at(evals, w, seeds, k, metric), grpo)
    return out


def diff_rows(est: dict[tuple, Interval], meta: dict) -> list[dict]:
    """The comparisons of :func:`estimates` as results rows (per-seed rows for F1 and EM)."""
    size = {"questions": meta["questions_held_out"], "samples": meta["eval_samples"]}
    rows = []
    for key, e in est.items():
        if key[0] == "vs-grpo":
            rows.append(interval_row(f"w={key[1]:g} - w=0 at step {key[3]}", key[2], e, seeds=len(meta["seeds"]),
                                     **size))
        elif key[3] is None or key[2] in ("f1", "em"):
            _, w, metric, seed = key
            who = f"seeds {','.join(map(str, meta['seeds']))}" if seed is None else f"seed {seed}"
            rows.append(interval_row(f"w={w:g} step {meta['steps']} - Stage 1 ({who})", metric, e, **size))
    return rows


def goals(est: dict[tuple, Interval], meta: dict, runs: dict[str, list[dict]]) -> list[dict]:
    """Issue 47's goals for the default recipe (w = ``RECIPE``), judged on :func:`estimates`."""
    hrr = RECIPE
    if hrr not in meta["weights"]:
        return [{"goal": "issue 47's goals (the default recipe, w = 0.2)",
                 "measured": f"w = 0.2 not run (weights {', '.join(f'{w:g}' for w in meta['weights'])})", "met": None}]
    pair = set(WEIGHTS) <= set(meta["weights"])
    updates = {len(r) for r in runs.values()}
    return goal_rows({m: est["gain", hrr, m, None] for m in ("f1", "em")},
                     [est["gain", hrr, "f1", s][0] for s in meta["seeds"]],
                     est["gain", hrr, "format_error_rate", None],
                     {m: est["vs-grpo", hrr, m, meta["steps"]] for m in ("q_com", "f1")} if pair else None,
                     len(updates) == 1 if pair else None)


def curves(evals: dict[str, dict], meta: dict, metric: str) -> dict[str, list[tuple[int, float, float, float]]]:
    """Held-out ``metric`` against step per w: (step, mean, 95% low, high), seeds pooled; step 0 is Stage 1."""
    out = {}
    for w in meta["weights"]:
        keys = {k: ["stage1"] if k == 0 else [eval_key(w, s, k) for s in meta["seeds"]] for k in meta["eval_steps"]}
        out[f"w={w:g}"] = [(k, *bootstrap(arm(evals, ks, metric))) for k, ks in keys.items()]
    return out


def eval_rows(evals: dict[str, dict]) -> list[dict]:
    """One row per evaluated model: its stats, F1's interval over questions and samples, its weights' hash."""
    rows = []
    for name, res in evals.items():
        s = res["stats"]
        _, lo, hi = bootstrap(arm(evals, [name], "f1"))
        rows.append({"model": name, **{m: s.get(m, 0.0) for m in EVAL_METRICS}, "f1_ci95": f"[{lo:.3f}, {hi:.3f}]",
                     "levels 1-5": "/".join(f"{s.get(f'level_{g}_frac', 0.0):.2f}" for g in range(1, 6)),
                     "weights_sha256": res["settings"]["weights_sha256"][:16]})
    return rows


def per_sample(evals: dict[str, dict]) -> dict[str, dict[str, list]]:
    """Each evaluated model's scores per held-out sample, as columns (``id``, ``sample``, then
    :data:`SAMPLE_METRICS`), kept in the results so that a later run's seeds can be pooled with these."""
    return {name: {k: [r.get(k, 0.0) for r in res["per_sample"]] for k in ("id", "sample", *SAMPLE_METRICS)}
            for name, res in evals.items()}


def train_rows(runs: dict[str, list[dict]]) -> list[dict]:
    """Per run: first-half vs second-half means of the training curves."""
    rows = []
    for name, metrics in runs.items():
        half = max(1, len(metrics) // 2)
        for phase, part in (("first half", metrics[:half]), ("second half", metrics[half:])):
            if part:
                rows.append({"run": name, "steps": phase} | {k: statistics.fmean(m.get(key, 0.0) for m in part)
                                                            for k, key in TRAIN_METRICS.items()})
    return rows


# ------------------------------------------------------------------ report


def report(evals: dict[str, dict], runs: dict[str, list[dict]], meta: dict, name: str,
           config: Path | None = None) -> list[dict]:
    """Tables and plots under benchmarks/results/, every file named ``<name>_*``; returns the goal rows."""
    from ziprl.plots import plot_curves

    seeds, steps, weights = meta["seeds"], meta["steps"], meta["weights"]
    est = estimates(evals, meta)
    goal = goals(est, meta, runs)
    write_results(f"{name}_goals", goal, meta, config)
    write_results(f"{name}_heldout", eval_rows(evals), meta | {"per_sample": per_sample(evals)}, config)
    write_results(f"{name}_diff", diff_rows(est, meta), meta, config)
    held = {m: curves(evals, meta, m) for m in ("f1", "em")}
    write_results(f"{name}_curve", [{"w": w, "step": k, "metric": m, "mean": mean, "ci95_low": lo, "ci95_high": hi}
                                    for m, cs in held.items() for w, pts in cs.items() for k, mean, lo, hi in pts],
                  meta, config)
    write_results(f"{name}_train", train_rows(runs), meta | {"curves": {n: [{k: m.get(key) for k, key in
                                                                         TRAIN_METRICS.items()} for m in r]
                                                                         for n, r in runs.items()}}, config)
    for metric, suffix in TRAIN_PLOTS:
        train = {f"w={w:g}": [(i + 1, statistics.fmean(runs[f"w{w:g}_seed{s}"][i].get(TRAIN_METRICS[metric], 0.0)
                                                         for s in seeds)) for i in range(steps)] for w in weights}
        plot_curves(train, RESULTS / f"{name}{suffix}.png", f"Training {metric}, mean over {len(seeds)} seed(s)",
                    metric)
    f1 = held["f1"]
    plot_curves({w: [(k, mean) for k, mean, _, _ in pts] for w, pts in f1.items()},
                RESULTS / f"{name}_heldout_f1.png",
                f"Held-out F1 ({meta['questions_held_out']} questions x {meta['eval_samples']}, "
                f"{len(seeds)} seed(s)), 95% intervals", "F1",
                bands={w: [(k, lo, hi) for k, _, lo, hi in pts] for w, pts in f1.items()})
    return goal


def log_eval_tb(tb_dir: Path, step: int, values: dict[str, float]) -> None:
    """``values`` as ``heldout/<name>`` TensorBoard scalars at ``step``."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tb_dir), filename_suffix=".heldout")
    for k, v in values.items():
        writer.add_scalar(f"heldout/{k}", v, step)
    writer.close()


def log_curves_tb(evals: dict[str, dict], meta: dict, out: Path) -> None:
    """Held-out scores against step in TensorBoard: each run's (with F1's interval over questions and samples)
    under ``<run>/tb``, the seeds pooled (F1 and EM with intervals) under ``<out>/tb/w<w>``."""
    for w in meta["weights"]:
        for s in meta["seeds"]:
            for k in meta["eval_steps"]:
                key = "stage1" if k == 0 else eval_key(w, s, k)
                _, lo, hi = bootstrap(arm(evals, [key], "f1"))
                stats = evals[key]["stats"]
                log_eval_tb(out / f"w{w:g}_seed{s}" / "tb", k, {m: stats.get(m, 0.0) for m in EVAL_METRICS}
                            | {"f1_ci95_low": lo, "f1_ci95_high": hi})
    for metric in ("f1", "em"):
        for w, pts in curves(evals, meta, metric).items():
            for k, mean, lo, hi in pts:
                log_eval_tb(out / "tb" / w.replace("=", ""), k, {metric: mean, f"{metric}_ci95_low": lo,
                                                                 f"{metric}_ci95_high": hi})


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=sorted(TASKS), default="invented", help="the questions (see above)")
    ap.add_argument("--quick", action="store_true", help="Stage 1 from 100 demonstrations, seed 0, w = 0.2 only, 3 "
                    "steps, one greedy sample per held-out question, evaluated at its last step")
    ap.add_argument("--config", help="default: the task's (configs/learn-invented.yaml, configs/learn-cpu.yaml)")
    ap.add_argument("--seeds", type=listed(at_least(0)), help="default: 0,1,2 (0 with --quick)")
    ap.add_argument("--weights", help="the arms' HRR weights w, one run per seed each; issue 47's goals are judged "
                    "on w = 0.2, the default recipe, when it is among them (default: 0,0.2; 0.2 with --quick)")
    ap.add_argument("--steps", type=at_least(1), help="RL steps per run (default: the config's learner.steps; 3 "
                    "with --quick)")
    ap.add_argument("--demos", type=int, help="demonstration episodes Stage 1 learns from, 0 for all (default: the "
                    "config's demos.limit; 100 with --quick)")
    ap.add_argument("--eval-every", type=at_least(1), help="evaluate every K-th step's checkpoint (default: half the "
                    "steps; with --quick, the last)")
    ap.add_argument("--eval-limit", type=at_least(1), default=100, help="the first N held-out questions")
    samples = ap.add_mutually_exclusive_group()
    samples.add_argument("--eval-samples", type=at_least(1), help="seeded samples per held-out question (default: 2; "
                         "with --quick one greedy sample)")
    samples.add_argument("--greedy", action="store_true", help="one greedy sample per held-out question instead")
    ap.add_argument("--stage1-model", type=model_dir, help="skip Stage 1 and start RL from this model directory")
    ap.add_argument("--out", help="runs and evaluations (default: runs/learning-<task>[-quick])")
    ap.add_argument("--workers", type=at_least(1), default=2, help="processes at a time (one torch thread each)")
    ap.add_argument("--stage1-only", action="store_true", help="build (or find) the Stage-1 model and stop")
    ap.add_argument("--name", type=results_name, help="results file prefix under benchmarks/results/ (default: learning_<task>, "
                    "+ _quick with --quick; a partial run under another name leaves the full run's results alone)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="a config override for Stage 1, the runs and the evaluations, e.g. learner.hrr_reference=causal "
                         "(repeatable); give a new --out with it")
    ap.add_argument("--eval-one", help=argparse.SUPPRESS)  # one evaluation, in a worker process (EvalSpec.command)
    args = ap.parse_args(argv)
    args.config = Path(args.config).resolve() if args.config else TASKS[args.task]  # workers start in the repository
    args.out = Path(args.out or REPO / "runs" / (f"learning-{args.task}" + ("-quick" if args.quick else "")))
    args.seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    if len(set(args.seeds)) != len(args.seeds):
        ap.error(f"--seeds {','.join(map(str, args.seeds))}: give each seed once")
    given = args.weights
    try:
        args.weights = tuple(float(w) for w in given.split(",")) if given else QUICK_WEIGHTS if args.quick else WEIGHTS
    except ValueError:  # not numbers: refused below with the same message
        args.weights = ()
    if not args.weights or len(set(args.weights)) != len(args.weights):
        ap.error(f"--weights {given}: give distinct numbers (e.g. --weights 0,0.2,1)")
    args.name = args.name or f"learning_{args.task}" + ("_quick" if args.quick else "")
    try:  # checked now, not after hours of runs
        for part in RESULT_PARTS:
            results_name(f"{args.name}_{part}")
        check_plots(args.name, PLOT_SUFFIXES)
    except argparse.ArgumentTypeError as exc:
        ap.error(f"--name {args.name}: {exc}")
    args.greedy = args.greedy or (args.quick and args.eval_samples is None)
    args.eval_samples = 1 if args.greedy else args.eval_samples or 2
    if args.quick:
        args.steps = QUICK_STEPS if args.steps is None else args.steps
        args.demos = QUICK_DEMOS if args.demos is None else args.demos
    if args.demos is not None and args.demos < 0:
        ap.error(f"--demos {args.demos}: give a number of demonstration episodes, or 0 for all")
    for o in args.set:
        key = o.partition("=")[0].strip()
        if key in OWNED:
            ap.error(f"--set {o}: the benchmark sets {key} for each run" + (f"; use {OWNED[key]}" if OWNED[key] else ""))
    try:
        cfg = load_config(args.config, args.set)
    except (UserError, OSError) as exc:
        ap.error(f"--set / --config: {exc}")
    for w in args.weights:
        try:
            load_config(args.config, [*args.set, f"learner.hrr_weight={w}"])
        except UserError as exc:
            ap.error(f"--weights {given}: {exc}")
    try:  # every run's and evaluation's settings as run() gives them, checked now, not in a worker process
        steps = cfg.learner.steps if args.steps is None else args.steps
        every = args.eval_every or (steps if args.quick else max(1, steps // 2))
        for w in args.weights:
            for s in args.seeds:
                load_config(args.config, [*stage1_sets(args), f"learner.hrr_weight={w}", f"learner.seed={s}",
                                          f"data.seed={s}", f"learner.steps={steps}", f"run.checkpoint_every={every}",
                                          "run.keep_checkpoints=0"])
        load_config(args.config, [*args.set, f"rollout.group_size={args.eval_samples}",
                                  "rollout.dynamic_sampling=false", f"sampling.greedy={str(args.greedy).lower()}"])
    except UserError as exc:
        ap.error(f"the settings the benchmark gives its runs and evaluations: {one_line(exc)}")
    return args


def stage1_sets(args: argparse.Namespace) -> list[str]:
    """The config overrides Stage 1 runs with: ``--set``, and ``--demos`` as ``demos.limit``."""
    return [*args.set, *([] if args.demos is None else [f"demos.limit={args.demos}"])]


def check_data(args: argparse.Namespace) -> None:
    """The data the benchmark reads, loaded and checked before ``--out`` is touched (exit 2 naming the problem): the
    demonstration questions of Stage 1 (unless ``--stage1-model``) and the task's questions, enough held-out ones
    for ``--eval-limit`` (unless ``--stage1-only``)."""
    from ziprl.env.demos import demo_examples

    try:
        if args.stage1_model is None:
            demo_examples(load_config(args.config, stage1_sets(args)))
        held_out = [] if args.stage1_only else task_questions(args.task)[1]
    except (UserError, OSError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    if not args.stage1_only and args.eval_limit > len(held_out):
        print(f"error: --eval-limit {args.eval_limit}: task {args.task} holds {len(held_out)} held-out questions; "
              f"pass --eval-limit {len(held_out)} or fewer", file=sys.stderr)
        raise SystemExit(2)


def eval_steps(steps: int, every: int, quick: bool) -> list[int]:
    """The steps evaluated: 0 (Stage 1), every ``every``-th and the last (with ``quick``: 0 and the last)."""
    found = [0, *range(every, steps + 1, every)]
    return [0, steps] if quick else found + ([steps] if found[-1] != steps else [])


def main() -> None:
    args = parse_args()
    if args.eval_one:
        job = json.loads(args.eval_one)
        spec = EvalSpec(*(Path(job[k]) for k in ("config", "held_out", "corpus")), job["samples"], job["greedy"],
                        tuple(job["overrides"]))
        evaluate(spec, Path(job["model"]), Path(job["cache"]), job["threads"])
        return
    check_data(args)
    # runs and evaluations go into a directory this benchmark marked (a rerun continues there)
    code = in_work_dir(args.out, lambda out: run(args, out))
    if code:
        raise SystemExit(code)


def run(args: argparse.Namespace, out: Path) -> None:
    """Stage 1, the RL runs and their evaluations in ``out``, then the results files."""
    t0, config, seeds = time.perf_counter(), args.config, args.seeds
    model = Path(args.stage1_model) if args.stage1_model else stage1(config, stage1_sets(args))
    log(f"Stage-1 model: {model}")
    if args.stage1_only:
        return
    train_path, held_path, corpus = split_questions(args.task, out, args.eval_limit)
    spec = EvalSpec(config, held_path, corpus, args.eval_samples, args.greedy, tuple(args.set))
    demo_questions = check_demos_disjoint(model, held_path)
    steps = load_config(config, []).learner.steps if args.steps is None else args.steps
    every = args.eval_every or (steps if args.quick else max(1, steps // 2))
    evaluated = eval_steps(steps, every, args.quick)
    weights = args.weights
    arms = {f"w{w:g}_seed{s}": (w, s) for s in seeds for w in weights}  # seed-major: each seed's pair side by side
    jobs, cache_dir = [], out / "eval"
    for name, (w, seed) in arms.items():
        overrides = [*args.set, f"data.dataset={train_path}", f"retriever.corpus={corpus}", f"learner.hrr_weight={w}",
                     f"learner.seed={seed}", f"data.seed={seed}", f"learner.steps={steps}",
                     f"run.sft_checkpoint={model}", f"run.checkpoint_every={every}",
                     "run.keep_checkpoints=0"]
        jobs.append(Job(name, functools.partial(rl_command, config, overrides, out / name)))
    jobs.append(Job("eval_stage1", lambda threads: eval_command(spec, model, cache_dir / "stage1.json", threads)))
    keys = ["stage1"]
    for name, (w, s) in arms.items():  # a run's checkpoints are evaluated as soon as it finishes
        for k in evaluated[1:]:
            key = eval_key(w, s, k)
            keys.append(key)
            jobs.append(Job(f"eval_{key}", lambda threads, name=name, k=k, key=key: eval_command(
                spec, checkpoint_model(out / name, k, model), cache_dir / f"{key}.json", threads), after=(name,)))
    run_parallel(jobs, args.workers, out / "logs")
    runs = {name: read_metrics(out / name) for name in arms}
    for name, metrics in runs.items():
        log(f"{name}: {len(metrics)} steps, reward {[round(m['rollout/reward'], 2) for m in metrics]}")
    evals = {key: json.loads((cache_dir / f"{key}.json").read_text()) for key in keys}
    meta = {"task": args.task, "quick": args.quick, "seeds": seeds, "weights": list(weights), "steps": steps,
            "eval_steps": evaluated, "questions_held_out": args.eval_limit, "eval_samples": args.eval_samples,
            "greedy": args.greedy, "stage1_model": portable(model), "demo_questions": demo_questions,
            "updates": {n: len(r) for n, r in runs.items()}, "zero_variance_groups_trained": {
                n: sum(m.get("rollout/zero_variance_groups_trained", 0) for m in r) for n, r in runs.items()},
            "workers": args.workers,
            "settings": load_config(config, stage1_sets(args)).to_dict(), "seconds": time.perf_counter() - t0}
    meta["stage1_weights_sha256"] = evals["stage1"]["settings"]["weights_sha256"]
    for extra, key in (("demos_counts.json", "demos"), ("sft_seconds.json", "stage1_sft")):
        if (model.parent / extra).is_file():
            meta[key] = json.loads((model.parent / extra).read_text())
    log_curves_tb(evals, meta, out)
    for row in report(evals, runs, meta, args.name, config):
        log(f"goal {'met' if row['met'] else 'NOT met' if row['met'] is False else 'not measured'}: {row['goal']}: "
            f"{row['measured']}")
    log(f"done in {meta['seconds'] / 60:.1f} min")


if __name__ == "__main__":
    main()
