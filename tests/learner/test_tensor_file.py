"""ziprl.learner.tensor_file: safetensors files written with direct I/O load back exactly, through any staging size,
and fall back to safetensors' own writer where the file system refuses direct I/O."""

from __future__ import annotations

import errno
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file

from tests.conftest import REPO
from ziprl.learner import tensor_file
from ziprl.learner.tensor_file import ALIGN, DTYPES, write_tensors

NAMES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)


def _tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g, dtype=torch.int64).to(dtype)


TENSORS = st.dictionaries(
    NAMES,
    st.builds(_tensor, st.sampled_from(list(DTYPES)), st.lists(st.integers(0, 9), max_size=3).map(tuple),
              st.integers(0, 2**16)),
    max_size=6)


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return got.keys() == want.keys() and all(
        got[k].dtype == want[k].dtype and got[k].shape == want[k].shape and torch.equal(got[k], want[k]) for k in want)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tensors=TENSORS, staging=st.sampled_from([ALIGN, 2 * ALIGN, 3 * ALIGN + 5, 1 << 20]))
def test_any_tensors_any_names_load_back_exactly(tmp_path, tensors, staging):
    """Every dtype it writes, empty and scalar shapes, any names (other scripts, controls, JSON's quote and
    backslash), staging buffers smaller than one tensor or than the header: safetensors reads back the same tensors."""
    path = tmp_path / "t.safetensors"
    write_tensors(tensors, path, staging=staging)
    assert _same(load_file(path), tensors)


def test_a_large_file_crosses_many_staging_buffers_and_is_cut_to_its_length(tmp_path):
    tensors = {"w": torch.randn(1000, 257), "b": torch.randn(3).bfloat16(), "rng": torch.get_rng_state()}
    path = tmp_path / "t.safetensors"
    write_tensors(tensors, path, staging=ALIGN)
    header = tensor_file.header(tensors)
    data = sum(t.numel() * t.element_size() for t in tensors.values())
    assert path.stat().st_size == len(header) + data  # the last block's padding is cut off
    assert _same(load_file(path), tensors)
    with safe_open(path, "pt") as f:
        assert sorted(f.keys()) == ["b", "rng", "w"]


def test_non_contiguous_tensors_are_written_as_their_values(tmp_path):
    base = torch.randn(6, 8)
    tensors = {"t": base.t(), "s": base[:, ::3]}
    write_tensors(tensors, tmp_path / "t.safetensors")
    assert _same(load_file(tmp_path / "t.safetensors"), {k: v.contiguous() for k, v in tensors.items()})


def test_a_file_system_that_refuses_direct_io_gets_the_buffered_writer(tmp_path, monkeypatch):
    """tmpfs (and others) answer O_DIRECT with EINVAL, at open or at the first write: the file is written anyway."""
    real_open, real_write = os.open, os.write
    tensors = {"w": torch.randn(5000), "i": torch.arange(7)}
    for where in ("open", "write"):
        if where == "open":
            monkeypatch.setattr(os, "open", lambda p, flags, *a: _refuse() if flags & os.O_DIRECT else
                                real_open(p, flags, *a))
        else:
            monkeypatch.setattr(os, "open", real_open)
            monkeypatch.setattr(os, "write", lambda fd, b: _refuse())
        path = tmp_path / f"{where}.safetensors"
        write_tensors(tensors, path)
        monkeypatch.setattr(os, "write", real_write)
        assert _same(load_file(path), tensors)


def _refuse():
    raise OSError(errno.EINVAL, "Invalid argument")


def test_other_write_errors_are_raised(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "write", lambda fd, b: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(OSError, match="No space") as raised:
        write_tensors({"w": torch.randn(10)}, tmp_path / "t.safetensors")
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(tmp_path / "t.safetensors")
    with pytest.raises(FileNotFoundError):
        write_tensors({"w": torch.randn(10)}, tmp_path / "missing" / "t.safetensors")


def test_a_name_safetensors_cannot_hold_is_refused_before_any_file_is_made(tmp_path):
    with pytest.raises(ValueError, match="surrogate.*rename"):
        write_tensors({"ok": torch.zeros(1), "bad\ud800": torch.zeros(1)}, tmp_path / "t.safetensors")
    assert not (tmp_path / "t.safetensors").exists()


def test_the_write_benchmark_refuses_bad_input_before_any_work(tmp_path, capsys, monkeypatch):
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    import checkpoint_write

    monkeypatch.setattr(sys, "argv", [str(REPO / "benchmarks" / "checkpoint_write.py")])  # its results are its own

    assert checkpoint_write.main(["--gb", "0"]) == 2
    assert checkpoint_write.main(["--dir", str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err
    seconds = checkpoint_write.timed_write(write_tensors, {"w": torch.randn(100)}, tmp_path / "t.safetensors")
    assert seconds > 0
    assert load_file(tmp_path / "t.safetensors")["w"].shape == (100,)
