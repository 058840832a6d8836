"""``python -m ziprl.train``: the stable entry point of the command in :mod:`ziprl.cli.train`."""

from ziprl.cli.train import main

if __name__ == "__main__":
    raise SystemExit(main())
