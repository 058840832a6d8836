"""Cold-start demonstrations: the scripted teacher plays episodes through the real retriever.

    python -m ziprl.demos [--datasets hotpotqa,musique] [--limit 100] [--out runs/demos.parquet]
                          [--config FILE.yaml] [--set section.field=value ...]

Only correct, well-formed trajectories are kept; the Parquet file holds one row per transition for
transition-level SFT (``python -m ziprl.sft``). See :mod:`ziprl.env.demos`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ziprl.boundary import run_command
from ziprl.cli.common import overrides
from ziprl.config import ConfigError, load_config
from ziprl.env.demos import build_demos


def check_out_file(out: Path) -> None:
    """ConfigError when ``demos.out`` is a directory or lies under a file (found before any episode is played)."""
    if out.is_dir():
        raise ConfigError(f"demos.out {out} is a directory; pass a file path for --out, e.g. {out / 'demos.parquet'}")
    for p in out.parents:
        if p.exists() and not p.is_dir():
            raise ConfigError(f"demos.out {out}: {p} is a file, not a directory; choose another --out")


@run_command
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--datasets", help="comma-separated dataset names (sample, hotpotqa, musique, pooled, a path)")
    ap.add_argument("--limit", type=int, help="questions per dataset (0 = all)")
    ap.add_argument("--out")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = ap.parse_args(argv)
    flags = {"demos.datasets": args.datasets, "demos.limit": args.limit, "demos.out": args.out}
    cfg = load_config(args.config, overrides(flags, args.set))
    check_out_file(Path(cfg.demos.out))
    path, counts = build_demos(cfg)
    print(f"[demos] kept {counts['kept']}/{counts['episodes']} episodes ({counts['wrong']} wrong, "
          f"{counts['malformed']} malformed, {counts['no_supporting_titles']} without supporting titles); "
          f"{counts['transitions']} transitions -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
