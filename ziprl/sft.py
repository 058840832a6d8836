"""``python -m ziprl.sft --demos FILE --out DIR``: cold-start SFT (see :mod:`ziprl.learner.sft`)."""

from ziprl.learner.sft import main

if __name__ == "__main__":
    raise SystemExit(main())
