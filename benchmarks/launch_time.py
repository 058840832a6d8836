"""The default launch end to end from an empty cache, per CPU class: ``python -m ziprl.launch`` on the embedded
defaults with a new ``ZIPRL_CACHE`` (policy conversion, index build, Stage 1 and two RL steps), as this CPU runs it
and held to a lower ISA. ``avx2`` holds torch's kernels, oneDNN, MKL and ZipRL's own choices (fused decode kernel,
bf16) to AVX2 (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``), as on an AVX2-only
laptop. Runs alternate between the classes; each row names the flags ZipRL saw, the precision the engines and the
learner chose, the total and the RL steps' seconds, and the memory the launch held at its peak: the proportional set
size (PSS: a page shared by n processes counts 1/n in each, so Ray's shared object store counts once) summed over
the launch's processes (the driver, Ray's services and workers, all its descendants), sampled every half second, with
the three largest processes at that moment.

    python benchmarks/launch_time.py [--isa native,avx2] [--repeats 1] [--name launch_time]

Set-up (``scripts/setup.sh``) is done first and not timed; the run's cache and outputs go into a temporary directory
this script creates and removes (kept, and named, when a run fails).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _common import CPU_FLAGS, REPO, results_name, write_results

from ziprl.policy.cpu.isa import cpu_flags

ISA_ENV = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}


def isa_list(text: str) -> list[str]:
    """An argparse ``type``: comma-separated names of :data:`ISA_ENV`."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in ISA_ENV]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text[:80]!r}: give one or more of {', '.join(ISA_ENV)}, comma-separated")
    return names


def summary(log: str) -> dict:
    """What the launch's output says: the RL steps' seconds, the engines' and the learner's precision."""
    rl = re.search(r"steps:\s+(\d+) of (\d+) \((\d+) s of RL steps\)", log)
    engine = re.search(r"the rollout engines generate in (\w+)", log)
    learner = re.search(r"\[learner\] .*?bf16 (on|off)", log)
    return {"steps": int(rl.group(1)) if rl else None, "rl_seconds": int(rl.group(3)) if rl else None,
            "engine_dtype": engine.group(1) if engine else None,
            "learner_bf16": {"on": True, "off": False}[learner.group(1)] if learner else None}


def seen_flags(env: dict[str, str]) -> list[str]:
    """The kernel-choosing flags ZipRL sees under ``env``'s ISA cap."""
    flags = cpu_flags(env.get("ONEDNN_MAX_CPU_ISA", ""))
    return [f for f in CPU_FLAGS if f in flags]


def run_once(isa: str, work: Path) -> dict:
    """One launch under ``isa`` with its cache and outputs in ``work``; its row."""
    env = os.environ | ISA_ENV[isa] | {"ZIPRL_CACHE": str(work / "cache")}
    log = work / "launch.log"
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ziprl.launch", "--out", str(work / "run")], stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=REPO)
        peak = peak_memory(proc)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"error: the {isa} launch exited {proc.returncode}; its log: {log}")
    return {"isa": isa, "cpu_flags_seen": ", ".join(seen_flags(env)), "seconds": round(seconds, 1),
            **summary(log.read_text(errors="replace")), **peak}


def role(p: psutil.Process) -> str:
    """What a process of the launch is: the driver, a Ray actor or task by class (``ray::RolloutActor``), or the
    name of a Ray service."""
    args = p.cmdline()
    first = args[0] if args else p.name()
    if first.startswith("ray::"):
        return first.split(".")[0].split()[0]
    return "driver" if "ziprl.launch" in args else Path(first).name


def peak_memory(proc: subprocess.Popen, every: float = 0.5) -> dict:
    """Sample the PSS of ``proc`` and its descendants until it ends: the peak of their sum (GB) and the three
    largest processes (role: GB) at that moment."""
    root, peak, top = psutil.Process(proc.pid), 0, []
    while proc.poll() is None:
        sizes = []
        for p in [root, *root.children(recursive=True)]:
            try:
                sizes.append((p.memory_full_info().pss, role(p)))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        total = sum(b for b, _ in sizes)
        if total > peak:
            peak, top = total, sorted(sizes, reverse=True)[:3]
        time.sleep(every)
    return {"peak_pss_gb": round(peak / 2**30, 2),
            "largest_at_peak": ", ".join(f"{name} {b / 2**30:.2f}" for b, name in top)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--isa", type=isa_list, default=list(ISA_ENV), help="CPU classes to run, in alternation")
    ap.add_argument("--repeats", type=int, default=1, help="runs per class")
    ap.add_argument("--name", type=results_name, default="launch_time", help="results file prefix")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    rows = []
    for r in range(args.repeats):
        for isa in args.isa if r % 2 == 0 else reversed(args.isa):  # alternate the order: drifting load hits both
            work = Path(tempfile.mkdtemp(prefix=f"ziprl-launch-{isa}-"))
            print(f"[launch_time] {isa} run {r + 1}/{args.repeats} (log: {work / 'launch.log'})", flush=True)
            rows.append({"repeat": r + 1, **run_once(isa, work)})
            print(f"[launch_time]   {rows[-1]['seconds']:.0f} s, RL steps {rows[-1]['rl_seconds']} s", flush=True)
            shutil.rmtree(work)  # this run's own temporary directory
    js, md = write_results(args.name, rows, {"isa_env": {k: ISA_ENV[k] for k in args.isa}, "repeats": args.repeats})
    print(f"[launch_time] wrote {js} and {md}")


if __name__ == "__main__":
    main()
