"""The commands: one thin module each (parse arguments, load the config, call the library).

Run them as ``python -m ziprl.<command>`` (the stable entry points, kept as 3-line modules beside the package's
library code) or as ``python -m ziprl.cli.<module>``:

| entry point | module | what it does |
|---|---|---|
| ``python -m ziprl.launch`` | :mod:`ziprl.cli.launch` | train on Ray: Stage 1 (demos + SFT), then GRPO + HRR |
| ``python -m ziprl.train`` | :mod:`ziprl.cli.train` | Stage 2 only (no Stage 1), the same training loop in one process (no Ray) |
| ``python -m ziprl.eval`` | :mod:`ziprl.cli.eval` | compare context strategies; ``--noise`` runs the noisy-retrieval sweep |
| ``python -m ziprl.index`` | :mod:`ziprl.cli.index` | build, adopt and query FAISS indexes |
| ``python -m ziprl.demos`` | :mod:`ziprl.cli.demos` | write scripted-teacher demonstrations for cold-start SFT |
| ``python -m ziprl.sft`` | :mod:`ziprl.cli.sft` | cold-start SFT on a demonstrations file |
| ``python -m ziprl.watch_teacher`` | :mod:`ziprl.cli.watch_teacher` | print scripted-teacher episodes turn by turn |

Nothing in the library imports a command. Two commands live with their packages, which need nothing above them:
``python -m ziprl.view`` (:mod:`ziprl.view.command`, the trajectory viewer) and ``python -m ziprl.config --show``
(:mod:`ziprl.config.show`).
"""
