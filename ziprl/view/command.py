"""The trajectory viewer's command: browse trajectories in a web browser.

    python -m ziprl.view RUN_DIR_OR_PARQUET [--port 8265] [--host 127.0.0.1] [--out report.html [--overwrite]]
                         [--tokenizer DIR | --tokenizer none]

RUN_DIR is what ``ziprl.train``/``ziprl.launch`` (``trajectories/step_*.parquet``) or ``ziprl.eval``
(``trajectories_<strategy>.parquet``) wrote. Without ``--out`` a local server on 127.0.0.1 serves the page;
with ``--out`` one self-contained HTML file (no external URLs) is written: to a new path, or over a report
this command wrote with ``--overwrite`` (see :mod:`ziprl.outputs`). A tokenizer (default: the
embedded policy's, when cached) decodes each turn's prompt to show the memory and raw observation it held.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ziprl.boundary import run_command
from ziprl.outputs import check_file
from ziprl.paths import atomic_write_text
from ziprl.view.data import ViewerError, load_run
from ziprl.view.page import render_page
from ziprl.view.server import address_family, is_loopback, make_server
from ziprl.view.tokens import make_decoder

GENERATOR_TAG = b'<meta name="generator" content="ziprl.view">'  # in the page's head (templates/page.html.j2)


def is_report(path: Path) -> bool:
    """Whether ``path`` is a report this command wrote: its head holds the page's generator tag."""
    with open(path, "rb") as f:
        return GENERATOR_TAG in f.read(4096)


def check_out(out: str, overwrite: bool) -> Path:
    """The report path ``out`` (normalised), once a report could be written there: a new path, or with
    ``overwrite`` a report this command wrote; UserError naming the fix, nothing created."""
    if Path(out).expanduser().is_file() and Path(out).suffix.lower() not in (".html", ".htm"):
        raise ViewerError(f"--out {out} exists and is not an HTML file; refusing to overwrite it: give a new path "
                         "or a report ziprl.view wrote, with --overwrite")
    return check_file(out, overwrite, is_report, "a report ziprl.view wrote", "report.html")


def _url(host: str, port: int) -> str:
    name = "localhost" if host in ("127.0.0.1", "localhost") else f"[{host}]" if ":" in host else host
    return f"http://{name}:{port}/"


@run_command
def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m ziprl.view", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="run directory or one trajectory Parquet file")
    ap.add_argument("--port", type=int, default=8265, help="0 picks a free port")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (anything but a loopback address exposes the "
                    "data); requests must name it, or localhost for a loopback one, in their Host header")
    ap.add_argument("--out", help="write a self-contained HTML report here instead of serving")
    ap.add_argument("--overwrite", action="store_true", help="replace --out when it is a report ziprl.view wrote")
    ap.add_argument("--tokenizer", help="tokenizer directory (tokenizer.json) to decode prompts; 'none' to skip")
    args = ap.parse_args(argv)
    if not 0 <= args.port <= 65535:
        raise ViewerError(f"--port must be in 0..65535, got {args.port} (--port 0 picks a free port)")
    out = check_out(args.out, args.overwrite) if args.out is not None else None
    if out is None:
        address_family(args.host)
    run = load_run(args.path)
    for path, why in run.skipped:
        print(f"[view] warning: skipped {path}: {why}", file=sys.stderr)
    run.decode = make_decoder(args.tokenizer, run)
    if out is not None:
        atomic_write_text(out, render_page(run, static=True))
        print(f"[view] wrote {out} ({run.num_episodes} episodes)")
        return 0
    server = make_server(run, args.host, args.port)
    if not is_loopback(server.server_address[0]):
        print(f"[view] warning: binding {args.host} lets other machines read these trajectories", file=sys.stderr)
    print(f"[view] {run.num_episodes} episodes: {_url(args.host, server.server_address[1])} (Ctrl-C to stop)",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
