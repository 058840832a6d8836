"""The viewer's charts: reward and Q_com lines, compression-level bars."""

from __future__ import annotations


def test_chart_geometry():
    from ziprl.view.charts import HEIGHT, PAD, level_bars, line_chart

    stats = [{"label": "step 1", "step": 1, "reward": 0.0, "q_com": None, "levels": [1.0, 0, 0, 0, 0]},
             {"label": "step 2", "step": 2, "reward": 1.0, "q_com": 0.5, "levels": [0.5, 0, 0, 0, 0.5]}]
    reward, q_com = line_chart(stats)["series"]
    assert [d["y"] for d in reward["dots"]] == [HEIGHT - PAD, PAD]  # 0 at the bottom, 1 at the top
    assert len(q_com["dots"]) == 1
    assert q_com["dots"][0]["y"] == (HEIGHT - PAD + PAD) / 2  # no point where None
    first, second = level_bars(stats)["bars"]
    assert [r["h"] for r in first] == [HEIGHT - 2 * PAD]
    assert [r["color"] for r in second] == ["#1b9e77", "#7570b3"]
    assert sum(r["h"] for r in second) == HEIGHT - 2 * PAD
