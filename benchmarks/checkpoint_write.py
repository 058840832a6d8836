"""Writing a checkpoint-sized safetensors file: direct I/O (``ziprl.learner.tensor_file.write_tensors``, what
checkpoints use) against safetensors' buffered ``save_file``, each followed by the fsync a checkpoint does.

    python benchmarks/checkpoint_write.py [--gb 1.6] [--rounds 2] [--pause 15] [--dir DIR] [--name checkpoint_write]

The default size is the launch's checkpoint (SmolLM2-135M: float32 weights and two AdamW moments). Before each write
the script waits ``--pause`` seconds: on a virtual machine whose host reclaims the guest's free memory, a write
right after the previous one reuses pages the host has not taken back yet and reads fast; a checkpoint comes a whole
learner step after the last one. The two writers alternate (ABAB...). The file is written under ``--dir`` (default:
a new temporary directory beside the results) and removed. Results: benchmarks/results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, results_name, write_results  # noqa: E402


def timed_write(writer, tensors, path: Path) -> float:
    """Seconds to write ``tensors`` to ``path`` with ``writer`` and fsync it."""
    t0 = time.perf_counter()
    writer(tensors, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=1.6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pause", type=float, default=15.0)
    ap.add_argument("--dir", help="where the file is written (default: a new temporary directory)")
    ap.add_argument("--name", type=results_name, default="checkpoint_write")
    args = ap.parse_args(argv)
    if args.gb <= 0 or args.rounds < 1 or args.pause < 0:
        print("checkpoint_write: need --gb > 0, --rounds >= 1 and --pause >= 0", file=sys.stderr)
        return 2
    if args.dir and not Path(args.dir).is_dir():
        print(f"checkpoint_write: --dir {args.dir} is not a directory; create it or leave --dir out", file=sys.stderr)
        return 2
    import torch
    from safetensors.torch import save_file

    from ziprl.learner.tensor_file import write_tensors

    n = int(args.gb * 1e9 / 4 / 200)
    tensors = {f"layer{i}": torch.randn(n) for i in range(200)}
    writers = {"direct I/O (write_tensors)": write_tensors, "buffered (safetensors save_file)": save_file}
    seconds: dict[str, list[float]] = {k: [] for k in writers}
    with tempfile.TemporaryDirectory(prefix="checkpoint_write-", dir=args.dir or RESULTS.parent) as tmp:
        path = Path(tmp) / "checkpoint.safetensors"
        for r in range(args.rounds):
            for name, writer in writers.items():
                time.sleep(args.pause)
                seconds[name].append(timed_write(writer, tensors, path))
                path.unlink()
                print(f"  round {r + 1}: {name} {seconds[name][-1]:.2f} s", flush=True)
    gb = sum(t.numel() * 4 for t in tensors.values()) / 1e9
    rows = [{"writer": name, "gb": gb, "runs": len(s), "median_s": statistics.median(s), "min_s": min(s),
             "max_s": max(s), "gb_per_s": gb / statistics.median(s)} for name, s in seconds.items()]
    write_results(args.name, rows, {"pause_s": args.pause, "rounds": args.rounds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
