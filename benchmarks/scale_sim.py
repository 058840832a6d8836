"""The paper's layout, simulated on this CPU: configs/paper.yaml with a tiny random Qwen3 and fractional CPUs.

    .venv/bin/python benchmarks/scale_sim.py [--actors 32] [--batch 64] [--group 8] [--ranks 4] [--steps 3]
                                             [--runs 1:object_store,1:collective,0:collective] [--max-turns 20] [--max-new-tokens 8]

Everything but the model's size is the paper's shape: 32 rollout actors (Ray actors with a sliver of a CPU
each), 64 questions x G = 8 per step, 4 learner ranks (DeepSpeed ZeRO-3 over gloo), up to 20 turns, the pooled
HotpotQA + MuSiQue corpus behind the Ray Serve retriever, the real driver and training loop
(``ziprl.actors.launch.launch``). The model is a Qwen3 (the paper's family) of 2 layers and hidden size 64 built from
a config, random-initialised, with SmolLM2's real tokenizer (nothing downloaded). It writes its output at
random, so episodes mostly run to the turn limit: the heaviest rollout load per question.

Reported per step and in total: groups generated / trained / dropped as stale (generated = trained + dropped +
buffered), actor idle and learner wait fractions, the staleness histogram, weight-push seconds and bytes, peak
RSS of every process (sampled), and where the wall time went. Results: benchmarks/results/scale_sim.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import results_names, write_results  # noqa: E402

from ziprl.outputs import OutputError  # noqa: E402
from ziprl.rundir import plan_run_dir, prepare_run_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs"  # each launch's run directory: runs/scale_sim_s<max_staleness>_<transport>
RESULT_PARTS = ("", "_memory", "_totals")  # the results report() writes: <name><part>.json and .md
ROLES = (("RolloutWorker", "rollout actor"), ("LearnerWorker", "learner rank"), ("Retriever", "retriever replica"),
         ("ServeController", "serve controller"), ("raylet", "raylet"), ("gcs_server", "gcs"))


def tiny_qwen3(out: Path) -> Path:
    """A 2-layer, hidden-64 random Qwen3 with SmolLM2's tokenizer, saved as a plain HF checkpoint."""
    if (out / "config.json").is_file():
        return out
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ziprl.config import ModelConfig
    from ziprl.policy.models import load_tokenizer, resolve_model_path

    tok = load_tokenizer(resolve_model_path(ModelConfig()))
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                         max_position_embeddings=8192, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    Qwen3ForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


class RSSMonitor:
    """Samples every process of the run every ``period`` s; keeps each one's peak RSS and USS, and its role.

    RSS counts the shared libraries (torch alone maps ~200 MB) in every process; USS is the memory only that
    process holds, which is what N actors on one node really add up to.
    """

    def __init__(self, period: float = 2.0):
        self.period, self.peak, self.uss, self.role = period, {}, {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            for p in psutil.process_iter(["pid", "name", "cmdline"]):
                cmd = " ".join(p.info["cmdline"] or []) + " " + (p.info["name"] or "")
                role = "driver" if p.info["pid"] == me.pid else next((r for key, r in ROLES if key in cmd), None)
                if role is None:
                    continue
                try:
                    mem = p.memory_full_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                pid = p.info["pid"]
                self.role[pid] = role
                self.peak[pid] = max(self.peak.get(pid, 0), mem.rss)
                self.uss[pid] = max(self.uss.get(pid, 0), mem.uss)
            self._stop.wait(self.period)

    def __enter__(self) -> RSSMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def by_role(self) -> dict[str, dict[str, float]]:
        """Per role: number of processes, the largest peak RSS and USS, and the sum of peak USS (MB)."""
        out: dict[str, dict[str, float]] = {}
        for pid, rss in self.peak.items():
            r = out.setdefault(self.role[pid], {"processes": 0, "rss_max_mb": 0.0, "uss_max_mb": 0.0, "uss_sum_mb": 0.0})
            r["processes"] += 1
            r["rss_max_mb"] = max(r["rss_max_mb"], rss / 2**20)
            r["uss_max_mb"] = max(r["uss_max_mb"], self.uss[pid] / 2**20)
            r["uss_sum_mb"] += self.uss[pid] / 2**20
        return out


def launch_config(args: argparse.Namespace, staleness: int, transport: str, model: Path | None):
    """The config of one launch (``model``: its Stage-1 model, None to check the inputs before it is built)."""
    from ziprl.config import load_config

    cpus_per_actor = round(0.8 / args.actors, 4)
    return load_config(ROOT / "configs" / "paper.yaml", [
        f"run.out_dir={RUNS / f'scale_sim_s{staleness}_{transport}'}", f"learner.steps={args.steps}",
        *([f"run.sft_checkpoint={model}"] if model else []),
        "model.engine=hf", "model.dtype=float32", "model.device=cpu", "learner.bf16=false",
        "learner.gradient_checkpointing=false", "learner.zero_stage=3", "learner.beta=0.001",
        f"learner.global_batch_questions={args.batch}", "learner.micro_batch_turns=8",
        f"rollout.group_size={args.group}", "rollout.batch_questions=1",
        f"env.max_turns={args.max_turns}", f"sampling.max_new_tokens={args.max_new_tokens}",
        f"ray.num_rollout_actors={args.actors}", f"ray.rollout_actor_cpus={cpus_per_actor}", "ray.rollout_gpus=0",
        f"ray.learner_ranks={args.ranks}", "ray.learner_cpus=0.1", "ray.learner_gpus=0",
        "ray.retriever_replicas=1", "ray.retriever_cpus=0.5", f"ray.max_staleness={staleness}",
        "run.checkpoint_every=1000", f"data.dataset={args.dataset}", f"weights.transport={transport}",
        *([f"retriever.index_dir={args.index_dir}"] if args.index_dir else []),
    ])


def launch_once(cfg) -> float:
    """``launch(cfg)`` on a local Ray cluster of 2 CPUs; returns its wall seconds (Ray's start not counted)."""
    import ray

    from ziprl.actors.launch import launch

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    t0 = time.perf_counter()
    launch(cfg, progress=True)
    return time.perf_counter() - t0


def run(cfg) -> dict:
    """One launch at the paper's layout, in a fresh run directory; returns the per-step metrics, totals and process
    memory."""
    out = Path(cfg.run.out_dir)
    prepare_run_dir(out, resume=False, overwrite=True)  # replaces only a marked run (checked up front)
    with RSSMonitor() as mon:
        wall = launch_once(cfg)
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {"staleness": cfg.ray.max_staleness, "transport": cfg.weights.transport, "wall_seconds": wall,
            "steps": steps, "memory": mon.by_role()}


def step_row(s: dict, staleness: int, transport: str) -> dict:
    keys = ("groups_generated", "groups_trained", "groups_dropped_stale", "groups_buffered", "actor_idle_frac",
            "learner_wait_frac", "rollout_failures")
    row = {"max_staleness": staleness, "transport": transport, "step": s["step"],
           **{k: s[f"system/{k}"] for k in keys}}
    row["balanced"] = s["system/groups_generated"] == (s["system/groups_trained"] + s["system/groups_dropped_stale"]
                                                       + s["system/groups_buffered"])
    row |= {f"lag_{k}": s.get(f"system/lag_{k}_groups", 0.0) for k in range(staleness + 1)}
    row |= {f"{k}_s": s[f"perf/{k}_seconds"] for k in ("step", "wait", "train", "push", "save")}
    row |= {"push_MB": s["perf/weight_push_bytes"] / 1e6, "turns": s["rollout/turns"],
            "prompt_tok_per_turn": s["rollout/prompt_tokens_per_turn"]}
    return row


def report(name: str, runs: list[dict], layout: dict) -> None:
    """Write the per-step table, the totals and the per-role memory of the launches done so far."""
    rows = [step_row(s, r["staleness"], r["transport"]) for r in runs for s in r["steps"]]
    memory = [{"max_staleness": r["staleness"], "transport": r["transport"], "role": role, **m}
              for r in runs for role, m in r["memory"].items()]
    totals = []
    for r in runs:
        steps, last = r["steps"], r["steps"][-1]
        totals.append({"max_staleness": r["staleness"], "transport": r["transport"], "wall_s": r["wall_seconds"],
                       "steps": len(steps), "groups_generated": last["system/groups_generated"],
                       "groups_trained": last["system/groups_trained"],
                       "groups_dropped_stale": last["system/groups_dropped_stale"],
                       "groups_buffered": last["system/groups_buffered"],
                       "push_s_mean": sum(s["perf/weight_push_seconds"] for s in steps) / len(steps),
                       "push_MB": last["perf/weight_push_bytes"] / 1e6,
                       "actor_idle_frac_mean": sum(s["system/actor_idle_frac"] for s in steps) / len(steps),
                       "learner_wait_frac_mean": sum(s["system/learner_wait_frac"] for s in steps) / len(steps)})
    model = "Qwen3, 2 layers, hidden 64, random init, SmolLM2 tokenizer"
    write_results(name, rows, {"layout": layout, "totals": totals, "memory": memory, "model": model})
    write_results(name + "_memory", memory)  # RESULT_PARTS: each checked when the arguments are parsed
    write_results(name + "_totals", totals)


def parse_runs(ap: argparse.ArgumentParser, text: str) -> list[tuple[int, str]]:
    """``--runs``'s (max_staleness, transport) pairs; exit 2 on a malformed or repeated one."""
    pairs = []
    for pair in text.split(","):
        staleness, sep, transport = (part.strip() for part in pair.partition(":"))
        if not sep or not staleness.isdigit() or not transport:
            ap.error(f"--runs: {pair!r} is not max_staleness:transport (e.g. 1:object_store)")
        if (int(staleness), transport) in pairs:
            ap.error(f"--runs: {pair!r} is given twice")
        pairs.append((int(staleness), transport))
    return pairs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, every launch's config loaded and its inputs checked (exit 2) before anything is written:
    ``runs`` (the pairs), ``configs`` (one per pair) and ``model`` (the tiny model's path) filled in."""
    from ziprl.boundary import UserError, one_line
    from ziprl.cli.common import check_inputs
    from ziprl.paths import cache_root

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--actors", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--runs", default="1:object_store,1:collective,0:collective",
                    help="comma-separated max_staleness:weights.transport pairs, one launch each")
    ap.add_argument("--max-turns", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--dataset", default="pooled", help="pooled (the paper-like corpus) or sample (quick trials)")
    ap.add_argument("--index-dir", help="an existing index of the dataset's corpus (e.g. from `ziprl.index adopt`)")
    ap.add_argument("--name", type=results_names(*RESULT_PARTS), default="scale_sim",
                    help="results name: <name>, <name>_memory and <name>_totals")
    args = ap.parse_args(argv)
    if args.actors < 1:
        ap.error(f"--actors {args.actors}: give at least 1")
    args.runs, args.model = parse_runs(ap, args.runs), cache_root() / "tiny-qwen3-h64"
    try:
        check_inputs(launch_config(args, *args.runs[0], None))  # the dataset, corpus and index the launches share
        args.configs = [launch_config(args, *pair, args.model) for pair in args.runs]
    except (UserError, OSError) as exc:
        ap.error(one_line(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:  # every run directory a launch replaces is checked before the first launch
        for cfg in args.configs:
            plan_run_dir(cfg.run.out_dir, resume=False, overwrite=True)
    except OutputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tiny_qwen3(args.model)
    layout = {k: getattr(args, k) for k in ("actors", "batch", "group", "ranks", "steps", "max_turns",
                                            "max_new_tokens", "dataset")}
    runs: list[dict] = []
    for cfg in args.configs:  # results are rewritten after every launch, so a long sweep keeps its part
        runs.append(run(cfg))
        report(args.name, runs, layout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
