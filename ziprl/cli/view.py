"""Browse trajectories in a web browser.

    python -m ziprl.view RUN_DIR_OR_PARQUET [--port 8265] [--host 127.0.0.1] [--out report.html]
                         [--tokenizer DIR | --tokenizer none]

RUN_DIR is what ``ziprl.train``/``ziprl.launch`` (``trajectories/step_*.parquet``) or ``ziprl.eval``
(``trajectories_<strategy>.parquet``) wrote. Without ``--out`` a local server on 127.0.0.1 serves the page;
with ``--out`` one self-contained HTML file (no external URLs) is written. A tokenizer (default: the
embedded policy's, when cached) decodes each turn's prompt to show the memory and raw observation it held.
"""

from __future__ import annotations

import argparse
import sys

from ziprl.paths import atomic_write_text
from ziprl.view.data import load_run
from ziprl.view.page import render_page
from ziprl.view.server import LOCAL_HOSTS, make_server
from ziprl.view.tokens import make_decoder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="run directory or one trajectory Parquet file")
    ap.add_argument("--port", type=int, default=8265, help="0 picks a free port")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (anything but localhost exposes the data)")
    ap.add_argument("--out", help="write a self-contained HTML report here instead of serving")
    ap.add_argument("--tokenizer", help="tokenizer directory (tokenizer.json) to decode prompts; 'none' to skip")
    args = ap.parse_args(argv)
    if not 0 <= args.port <= 65535:
        print(f"error: --port must be in 0..65535, got {args.port}", file=sys.stderr)
        return 2
    try:
        run = load_run(args.path)
        run.decode = make_decoder(args.tokenizer, run)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        out = atomic_write_text(args.out, render_page(run, static=True))
        print(f"[view] wrote {out} ({run.num_episodes} episodes)")
        return 0
    if args.host not in LOCAL_HOSTS:
        print(f"[view] warning: binding {args.host} lets other machines read these trajectories", file=sys.stderr)
    server = make_server(run, args.host, args.port)
    host, port = server.server_address[:2]
    print(f"[view] {run.num_episodes} episodes: http://{'localhost' if args.host in LOCAL_HOSTS else host}:{port}/ "
          "(Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
