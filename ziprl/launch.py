"""``python -m ziprl.launch``: the stable entry point of the command in :mod:`ziprl.cli.launch`."""

from ziprl.cli.launch import main

if __name__ == "__main__":
    raise SystemExit(main())
