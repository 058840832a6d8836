"""What training writes inside an output directory's ``checkpoints/`` and ``tb/`` (a train/launch run's and an SFT
run's), as :func:`ziprl.outputs.entries` patterns: ``--overwrite`` deletes such a directory only when it holds
nothing else. Torch-free, so the run-directory rule imports it without the learner."""

# checkpoints/: the latest pointer and step_<n>-<id>/ with their four files (ziprl.learner.checkpoint.FILES)
CHECKPOINT_ENTRIES = r"checkpoints(?:/latest|/step_\d+(?:-[0-9a-f]+)?(?:/(?:model|optimizer|rng)\.safetensors|/state\.json)?)?"
TB_ENTRIES = r"tb(?:/events\.out\.tfevents\.[^/]+)?"  # tb/: TensorBoard's event files
