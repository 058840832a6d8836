"""``python -m ziprl.watch_teacher``: the stable entry point of the command in :mod:`ziprl.cli.watch_teacher`."""

from ziprl.cli.watch_teacher import main

if __name__ == "__main__":
    raise SystemExit(main())
