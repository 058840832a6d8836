"""``python -m ziprl.sft``: the stable entry point of the command in :mod:`ziprl.cli.sft`."""

from ziprl.cli.sft import main

if __name__ == "__main__":
    raise SystemExit(main())
