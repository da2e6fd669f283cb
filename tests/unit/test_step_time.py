"""bench/step_time.py's table: the steps' gap, the batch, and the decode tokens a second."""

from __future__ import annotations

import pytest

from bench.step_time import render_markdown, tokens_per_s


def test_tokens_a_second_are_the_batch_over_the_steps_gap() -> None:
    assert tokens_per_s(15.4, 0.109) == pytest.approx(141.3, abs=0.1)
    assert tokens_per_s(None, 0.1) is None and tokens_per_s(8.0, None) is None
    assert tokens_per_s(8.0, 0.0) is None


def test_the_table_rounds_the_batch_and_shows_where_throughput_stops_rising() -> None:
    def row(limit: int, gap_s: float, batch: float | None) -> dict[str, object]:
        return {
            "burners": 0,
            "limit": limit,
            "samples": 12,
            "tpot_median_s": gap_s,
            "tpot_min_s": gap_s * 0.9,
            "tpot_max_s": gap_s * 2,
            "batch_median": batch,
        }

    doc = {
        "measured_at_unix_s": 0.0,
        "command": "python bench/step_time.py --prompt-tokens 100",
        "machine": "m",
        "settings": {
            "prompt_tokens": 100,
            "max_tokens": 32,
            "every_s": 2,
            "measure_s": 24,
            "settle_s": 10,
        },
        "rows": [row(16, 0.126, 15.350000000000001), row(48, 0.296, 46.85), row(64, 0.5, None)],
    }
    text = render_markdown(doc)
    assert "| 0 | 16 | 126 [113-252] | 15.4 | 122 | 12 |" in text
    assert "| 0 | 48 | 296 [266-592] | 46.9 | 158 | 12 |" in text
    assert "| 0 | 64 | 500 [450-1000] | - | - | 12 |" in text
