"""``python -m ziprl.view``: the stable entry point of the command in :mod:`ziprl.cli.view`."""

from ziprl.cli.view import main

if __name__ == "__main__":
    raise SystemExit(main())
