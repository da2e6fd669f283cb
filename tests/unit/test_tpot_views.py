"""bench/tpot_views.py: the daemon's TPOT lines and the percentiles the table shows."""

from __future__ import annotations

import logging

import pytest

from appliance.json_log import JsonFormatter
from bench.tpot_views import Row, daemon_tpots, pct, render


def _line(event: str, **fields: object) -> str:
    """A daemon log line as the daemon writes it (its JSON formatter, as accounting logs)."""
    record = logging.LogRecord("appliance.requests", logging.INFO, "", 0, "x", None, None)
    for key, value in {"event": event, **fields}.items():
        setattr(record, key, value)
    return JsonFormatter().format(record)


def test_the_daemons_done_lines_give_each_requests_tpot() -> None:
    lines = [
        _line("request_done", ev_status="ok", ev_tpot_s=0.345),
        _line("request_done", ev_status="ok", ev_tpot_s=None),  # one token: no TPOT
        _line("request_done", ev_status="ok", ev_tpot_s=0),
        _line("engine_ready", ev_tpot_s=0.9),  # not a request
        "a raw text line from the engine",
        _line("request_done", ev_status="ok", ev_tpot_s=0.2),
    ]
    assert daemon_tpots(lines) == [0.345, 0.2]


def test_percentiles_are_nearest_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert (pct(values, 50), pct(values, 99), pct(values, 100)) == (50.0, 99.0, 100.0)
    assert pct([3.0], 99) == 3.0
    assert pct([], 50) is None


def test_the_table_puts_the_two_views_side_by_side() -> None:
    row = Row(48, 126, 126, 0.345, 0.567, 0.345, 0.567, 1.1)
    text = render([row, Row(24, 0, 0, None, None, None, None, None)], "python bench/x")
    assert "| 48 | 126 / 126 | 345 / 567 | 345 / 567 | 1.1 |" in text
    assert "| 24 | 0 / 0 | - / - | - / - | - |" in text


def test_bad_levels_name_the_flag() -> None:
    from bench.tpot_views import main

    with pytest.raises(SystemExit, match="levels"):
        main(["--levels", "0"])
    with pytest.raises(SystemExit, match="levels"):
        main(["--levels", "a"])
