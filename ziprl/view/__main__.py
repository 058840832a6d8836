"""``python -m ziprl.view``: the trajectory viewer's command, :mod:`ziprl.view.command`."""

from ziprl.view.command import main

if __name__ == "__main__":
    raise SystemExit(main())
