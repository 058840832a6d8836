"""Inputs and snapshots for the output-safety tests: a small corpus, its vectors and a stub encoder, a demos row,
a checkpoint that verifies, and every path's digest under a folder."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import numpy as np

from ziprl.retrieval.corpus import write_corpus
from ziprl.retrieval.types import Passage

DEMO_ROW = {"question_id": "q", "source": "s", "turn": 1, "messages": json.dumps([{"role": "user", "content": "q"}]),
            "response": "<answer>x</answer>", "action": "answer", "level": 1, "q_com": 0.5}


def digests(root: Path) -> dict[str, object]:
    """Every path under ``root`` (links not followed) -> sha256 of a file, a link's target, or 'dir'."""
    out: dict[str, object] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(top, name)
            rel = str(p.relative_to(root))
            out[rel] = (("link", os.readlink(p)) if p.is_symlink() else "dir" if p.is_dir()
                        else hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def corpus(path: Path) -> Path:
    return write_corpus([Passage(f"d{i}", f"T{i}", f"text {i}") for i in range(3)], path)


class StubEncoder:
    """What build_index asks of an encoder when the vectors are given: 4-dim, no model."""

    dim, encoder_id, path, query_prefix, passage_prefix = 4, "stub", None, "", ""


def vectors(path: Path) -> Path:
    np.save(path, np.eye(3, 4, dtype=np.float32))
    return path


def fake_checkpoint(root: Path) -> None:
    """What verify_checkpoint accepts: the four files, empty safetensors, a state with every field."""
    ck = root / "step_1"
    ck.mkdir(parents=True)
    for name in ("model", "optimizer", "rng"):
        (ck / f"{name}.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    (ck / "state.json").write_text(json.dumps({"step": 1, "policy_version": 1} | dict.fromkeys(
        ("optimizer", "scheduler", "rng", "data_position"), {})))
    (root / "latest").write_text("step_1\n")
