"""``python -m ziprl.demos``: the stable entry point of the command in :mod:`ziprl.cli.demos`."""

from ziprl.cli.demos import main

if __name__ == "__main__":
    raise SystemExit(main())
