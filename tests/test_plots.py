"""ziprl/plots.py: every plot is written atomically, so an earlier PNG stays whole until the new one is complete."""

from __future__ import annotations

import pytest

from ziprl.plots import _plt, plot_curves, save_figure

PNG = b"\x89PNG\r\n\x1a\n"


def test_a_plot_replaces_an_earlier_one_and_closes_its_figure(tmp_path):
    path = tmp_path / "curve.png"
    path.write_bytes(PNG + b"an earlier plot")
    assert plot_curves({"w=0": [(1, 0.1), (2, 0.3)]}, path, "F1", "F1") == path
    assert path.read_bytes().startswith(PNG)
    assert path.read_bytes() != PNG + b"an earlier plot"
    assert _plt().get_fignums() == []
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]


def test_a_plot_that_fails_while_writing_keeps_the_earlier_one_whole(tmp_path):
    path = tmp_path / "curve.png"
    path.write_bytes(PNG + b"an earlier plot")
    fig, _ = _plt().subplots()

    def torn(target, **kwargs):
        with open(target, "wb") as f:
            f.write(PNG[:4])
        raise OSError(28, "No space left on device")

    fig.savefig = torn
    with pytest.raises(OSError, match="No space"):
        save_figure(fig, path)
    _plt().close(fig)
    assert path.read_bytes() == PNG + b"an earlier plot"
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]
