"""``python -m ziprl.eval``: the stable entry point of the command in :mod:`ziprl.cli.eval`."""

from ziprl.cli.eval import main

if __name__ == "__main__":
    raise SystemExit(main())
