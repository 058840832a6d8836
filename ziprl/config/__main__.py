"""``python -m ziprl.config --show [--config FILE.yaml] [--set section.field=value ...]``: :mod:`ziprl.config.show`."""

import sys

from ziprl.config.show import main

if __name__ == "__main__":
    sys.exit(main())
