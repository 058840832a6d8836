"""The screen ``ziprl.train`` and ``ziprl.launch`` end on: what ran, the steps, how reward, format errors and Q_com
moved, where the run's outputs are, and the commands to go on with (view, evaluate, train longer).

:func:`run_summary` builds the text from the run's per-step metrics (``<out>/metrics.jsonl``) and a few facts
(:class:`RunFacts`); it reads nothing. :func:`summary_for` gathers those from a finished run directory.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ziprl.config import ZipRLConfig

TRENDS = (("rollout/reward", "reward"), ("rollout/format_error_rate", "format errors / turn"),
          ("rollout/q_com", "Q_com"))
LABEL_WIDTH = 24
SHOWN_STEPS = 8  # up to this many steps, every step's value is shown; beyond, the first and last quarter's means


@dataclass(frozen=True)
class RunFacts:
    """What a summary says beside the metrics. Paths are as the user should type them."""

    command: str  # the module run, e.g. "ziprl.launch"
    what: str  # one line: what ran (:func:`what_ran`)
    steps: int  # learner.steps asked for
    out: str  # the run directory
    base_model: str  # a model directory with the run's config and tokenizer files, which an exported checkpoint takes
    checkpoint: str | None  # the run's latest checkpoint (None: none was written)
    config_args: tuple[str, ...] = ()  # --config / --set arguments that rebuild the run's configuration
    run_args: tuple[str, ...] = ()  # the command's other arguments a resumed run repeats (--out, --sft-checkpoint, ...)


def what_ran(cfg: ZipRLConfig, stage1: bool) -> str:
    """One line naming the stages, the algorithm, the batch, the data and the model of a run of ``cfg``."""
    lr = cfg.learner
    estimator = "GRPO" if lr.advantage_estimator == "grpo" else lr.advantage_estimator  # A_i; HRR is the w term
    reference = ", causal Q_bar" if lr.hrr_reference == "causal" else ""
    algo = f"{estimator} + HRR (w = {lr.hrr_weight:g}{reference})" if lr.hrr_weight else estimator
    model = cfg.model.path or "the embedded SmolLM2-135M-Instruct"
    start = ("Stage 1 (scripted demos + SFT), then " if stage1 else
             f"from {cfg.run.sft_checkpoint}: " if cfg.run.sft_checkpoint else "from the base model: ")
    return (f"{start}{lr.steps} {algo} steps of {lr.global_batch_questions} question(s) x G = "
            f"{cfg.rollout.group_size} on '{cfg.data.dataset}' ({cfg.env.strategy} strategy); model: {model}")


def step_rows(lines: Iterable[str]) -> list[dict[str, float]]:
    """Each learner step's metrics from the lines of ``metrics.jsonl``, in step order; a step logged twice (by a run
    resumed before :class:`ziprl.tb.MetricsLogger` replaced such rows) keeps its last row."""
    rows: dict[int, dict[str, float]] = {}
    for line in lines:
        if line.strip():
            row = json.loads(line)
            rows[int(row["step"])] = row
    return [rows[k] for k in sorted(rows)]


def trend(values: list[float]) -> str:
    """``0.00 → 0.05 → 0.12`` for up to :data:`SHOWN_STEPS` values; for more, first → last and the means of the
    first and last quarter of the steps."""
    if not values:
        return "not logged"
    if len(values) <= SHOWN_STEPS:
        return " → ".join(f"{v:.2f}" for v in values)
    k = len(values) // 4
    head, tail = sum(values[:k]) / k, sum(values[-k:]) / k
    return (f"{values[0]:.2f} → {values[-1]:.2f} (mean of the first {k} steps {head:.2f}, "
            f"of the last {k} {tail:.2f})")


def _cmd(*words: str) -> str:
    return shlex.join(words)


def _without_model_path(args: tuple[str, ...]) -> list[str]:
    """``args`` less any ``--set model.path=...``, which would override ``--model``."""
    pairs = zip(args[::2], args[1::2], strict=True)
    return [a for flag, value in pairs if not (flag == "--set" and value.startswith("model.path=")) for a in (flag, value)]


def next_commands(facts: RunFacts) -> list[tuple[str, str]]:
    """(what for, command line) of the commands a user runs next: view, evaluate, train longer."""
    out = facts.out.rstrip("/")
    cmds = [("view the trajectories", _cmd("python", "-m", "ziprl.view", out))]
    if facts.checkpoint is not None:
        model, evaluation = f"{out}-step{facts.steps}-model", f"{out}-step{facts.steps}-eval"
        export = (f"from ziprl.learner.checkpoint import export_model; export_model({json.dumps(facts.checkpoint)}, "
                  f"{json.dumps(facts.base_model)}, {json.dumps(model)})")
        cmds += [("export the policy", _cmd("python", "-c", export)),
                 ("evaluate it", _cmd("python", "-m", "ziprl.eval", "--model", model, "--out", evaluation,
                                      *_without_model_path(facts.config_args)))]
        cmds.append(("train longer", _cmd("python", "-m", facts.command, *facts.run_args, *facts.config_args,
                                          "--resume", "--steps", str(2 * facts.steps))))
    return cmds


def run_summary(facts: RunFacts, rows: list[dict[str, float]]) -> str:
    """The end-of-run screen for ``facts`` and the run's per-step metrics ``rows`` (:func:`step_rows`)."""
    last = int(rows[-1]["step"]) if rows else 0
    seconds = sum(r.get("perf/step_seconds", 0.0) for r in rows)
    out = facts.out.rstrip("/")
    lines = [f"── {facts.command}: done " + "─" * 40,
             f"ran:    {facts.what}",
             f"steps:  {last} of {facts.steps}" + (f" ({seconds:.0f} s of RL steps)" if rows else ""),
             *(f"  {label:<{LABEL_WIDTH}}{trend([r[key] for r in rows if key in r])}" for key, label in TRENDS),
             "outputs:",
             f"  {'TensorBoard':<{LABEL_WIDTH}}tensorboard --logdir {shlex.quote(out + '/tb')}",
             f"  {'checkpoints':<{LABEL_WIDTH}}{facts.checkpoint or 'none written'}",
             f"  {'trajectories':<{LABEL_WIDTH}}{out}/trajectories/step_*.parquet",
             f"  {'metrics':<{LABEL_WIDTH}}{out}/metrics.jsonl",
             "next:"]
    lines += [f"  {what:<{LABEL_WIDTH}}{cmd}" for what, cmd in next_commands(facts)]
    return "\n".join(lines)


def shown(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies under it, else as it is."""
    p = Path(path)
    try:
        return str(p.relative_to(Path.cwd())) if p.is_absolute() else str(p)
    except ValueError:
        return str(p)


def config_arguments(config: str | None, sets: list[str]) -> tuple[str, ...]:
    """The ``--config`` / ``--set`` arguments that give a command the configuration of this run."""
    return (("--config", config) if config else ()) + tuple(a for s in sets for a in ("--set", s))


def run_arguments(out: str | Path, flags: dict[str, object]) -> tuple[str, ...]:
    """``--out OUT`` and each of ``flags`` given (None: not given) with its value: what a resumed run repeats."""
    return ("--out", shown(out)) + tuple(a for flag, v in flags.items() if v is not None for a in (flag, str(v)))


def summary_for(cfg: ZipRLConfig, command: str, stage1: bool, config_args: tuple[str, ...],
                run_args: tuple[str, ...]) -> str:
    """:func:`run_summary` of the finished run in ``cfg.run.out_dir``: its metrics and latest checkpoint. The model an
    exported checkpoint takes its config and tokenizer from is ``run.sft_checkpoint``, else the configured (or
    embedded) model, which Stage 1's model shares them with."""
    from ziprl.learner.checkpoint import latest_checkpoint
    from ziprl.policy.models import resolve_model_path

    out = Path(cfg.run.out_dir)
    metrics = out / "metrics.jsonl"
    rows = step_rows(metrics.read_text(encoding="utf-8").splitlines()) if metrics.is_file() else []
    ckpt = latest_checkpoint(out)
    base = cfg.run.sft_checkpoint or resolve_model_path(cfg.model)
    facts = RunFacts(command, what_ran(cfg, stage1), cfg.learner.steps, shown(out), shown(base),
                     None if ckpt is None else shown(ckpt), config_args, run_args)
    return run_summary(facts, rows)
