"""Writing a checkpoint-sized safetensors file: direct I/O (``ziprl.learner.tensor_file.write_tensors``, what
checkpoints use) against safetensors' buffered ``save_file``, each followed by the fsync a checkpoint does.

    python benchmarks/checkpoint_write.py [--gb 1.6] [--rounds 2] [--pause 15] [--dir DIR] [--name checkpoint_write]

The default size is the launch's checkpoint (SmolLM2-135M: float32 weights and two AdamW moments). Before each write
the script waits ``--pause`` seconds: on a virtual machine whose host reclaims the guest's free memory, a write
right after the previous one reuses pages the host has not taken back yet and reads fast; a checkpoint comes a whole
learner step after the last one. The two writers alternate (ABAB...). The file is written in a new temporary
directory under ``--dir`` (default: the system's temporary directory, ``$TMPDIR`` or /tmp, never the repository, where a
killed run would leave it) and removed. Results: benchmarks/results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import at_least, results_name, write_results  # noqa: E402


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


def available_gb() -> float | None:
    """Memory this machine has available now (GB); None where psutil is not installed."""
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().available / 1e9


def arguments(argv: list[str] | None) -> tuple[argparse.Namespace, tempfile.TemporaryDirectory]:
    """The parsed arguments and the new temporary directory the file is written in; argparse's exit (2, with one
    error line) for bad input, before any work."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=at_least(0.001, float), default=1.6,
                    help="size of the file written (held in memory as float32 tensors)")
    ap.add_argument("--rounds", type=at_least(1), default=2, help="writes per writer, alternating")
    ap.add_argument("--pause", type=at_least(0.0, float), default=15.0, help="seconds to wait before each write")
    ap.add_argument("--dir", help="an existing writable directory the file is written under (default: the system's "
                                  "temporary directory, $TMPDIR or /tmp)")
    ap.add_argument("--name", type=results_name, default="checkpoint_write",
                    help="results name: benchmarks/results/<name>.{json,md}")
    args = ap.parse_args(argv)
    if args.dir and not Path(args.dir).is_dir():
        ap.error(f"--dir {args.dir}: not a directory; create it or leave --dir out")
    where = Path(args.dir) if args.dir else Path(tempfile.gettempdir())  # not the repository: see the docstring
    try:  # before the tensors are built: a directory that cannot be written is refused at once
        tmp = tempfile.TemporaryDirectory(prefix="checkpoint_write-", dir=where)
    except OSError as exc:
        ap.error(f"--dir {where}: cannot write there ({exc.strerror}); give a writable directory or leave --dir out")
    free, memory = shutil.disk_usage(tmp.name).free / 1e9, available_gb()
    if args.gb * 1.05 > free or (memory is not None and args.gb > memory):
        tmp.cleanup()
        room = (f"{where} has {free:.1f} GB free; give a smaller --gb or another --dir" if args.gb * 1.05 > free
                else f"the tensors are held in memory and {memory:.1f} GB is available; give a smaller --gb")
        ap.error(f"--gb {args.gb:g}: {room}")
    return args, tmp


def main(argv: list[str] | None = None) -> int:
    try:
        args, tmp = arguments(argv)
    except SystemExit as exc:  # returned, not raised, to a caller of main (0 after --help)
        return int(exc.code or 0)
    import torch
    from safetensors.torch import save_file

    from ziprl.learner.tensor_file import write_tensors

    n = int(args.gb * 1e9 / 4 / 200)
    tensors = {f"layer{i}": torch.randn(n) for i in range(200)}
    writers = {"direct I/O (write_tensors)": write_tensors, "buffered (safetensors save_file)": save_file}
    seconds: dict[str, list[float]] = {k: [] for k in writers}
    with tmp:
        path = Path(tmp.name) / "checkpoint.safetensors"
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
