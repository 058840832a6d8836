"""Trajectory viewer: ``python -m ziprl.view RUN_DIR`` (a local page) or ``--out report.html`` (a static file)."""
