"""``python -m ziprl.index``: the stable entry point of the command in :mod:`ziprl.cli.index`."""

from ziprl.cli.index import main

if __name__ == "__main__":
    raise SystemExit(main())
