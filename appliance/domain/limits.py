"""Limits that more than one way in shares, stated once; the error for inputs outside them.

A policy's frozen config checks its own invariants in `__post_init__` and raises
`InvariantError`, whatever built it (the config file, the admin API, recalibration). Each edge
names the problems in its own words: the config names yaml keys, the API its parameters. So a
message refers to another field as `{field}` and `Problem.render` says it as the edge likes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# A concurrency limit (requests running at once), whoever sets it: the controller's bounds,
# the admission limit, an operator's manual limit, engine.max_num_seqs.
CONCURRENCY_LIMIT_MIN = 1
CONCURRENCY_LIMIT_MAX = 4096
# A p99 latency objective (TTFT, TPOT, end to end): a millisecond to an hour.
SLO_MIN_S = 0.001
SLO_MAX_S = 3600.0
# How a message states each range: "[1, 4096]", "[0.001, 3600] s".
CONCURRENCY_RANGE_TEXT = f"[{CONCURRENCY_LIMIT_MIN}, {CONCURRENCY_LIMIT_MAX}]"
SLO_RANGE_TEXT = f"[{SLO_MIN_S:g}, {SLO_MAX_S:g}] s"

_REF = re.compile(r"\{(\w+)\}")


def in_concurrency_range(value: int) -> bool:
    """True for a concurrency limit inside [CONCURRENCY_LIMIT_MIN, CONCURRENCY_LIMIT_MAX]."""
    return CONCURRENCY_LIMIT_MIN <= value <= CONCURRENCY_LIMIT_MAX


def in_slo_range(value_s: float) -> bool:
    """True for a latency objective inside [SLO_MIN_S, SLO_MAX_S] seconds."""
    return SLO_MIN_S <= value_s <= SLO_MAX_S


@dataclass(frozen=True)
class Problem:
    """One input outside its limit: the field, and what is wrong, naming other fields as
    `{field}` so the edge that reports it can use its own names for them."""

    field: str
    message: str

    def render(self, names: Mapping[str, str] | None = None) -> str:
        """The message with each `{field}` said as `names` says it (else as the field)."""
        names = names or {}
        return _REF.sub(lambda m: names.get(m[1], m[1]), self.message)


class InvariantError(ValueError):
    """Inputs a policy refuses: every problem at once, as `field: message; ...`."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems = tuple(problems)
        super().__init__("; ".join(f"{p.field}: {p.render()}" for p in self.problems))


def raise_problems(problems: Iterable[Problem]) -> None:
    """Raise InvariantError when there is any problem."""
    found = tuple(problems)
    if found:
        raise InvariantError(found)
