"""Where a long message is cut, and what each pass asks."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.domain import chunking
from appliance.domain.chunking import Window


@pytest.mark.parametrize(
    ("n", "chunk", "overlap", "expected"),
    [
        (0, 10, 2, []),
        (5, 10, 2, [Window(0, 5)]),
        (10, 10, 2, [Window(0, 10)]),
        (11, 10, 2, [Window(0, 10), Window(8, 11)]),
        (26, 10, 2, [Window(0, 10), Window(8, 18), Window(16, 26)]),
        (20, 10, 0, [Window(0, 10), Window(10, 20)]),
    ],
)
def test_windows_table(n: int, chunk: int, overlap: int, expected: list[Window]):
    assert chunking.windows(n, chunk, overlap) == expected


@given(
    n=st.integers(1, 5000), chunk=st.integers(2, 600), overlap_share=st.floats(0, 0.9)
)
def test_windows_cover_everything_with_the_overlap(n: int, chunk: int, overlap_share: float):
    overlap = min(chunk - 1, int(chunk * overlap_share))
    wins = chunking.windows(n, chunk, overlap)
    assert wins[0].start == 0 and wins[-1].end == n
    assert all(0 < w.tokens <= chunk for w in wins)
    for a, b in itertools.pairwise(wins):
        assert b.start == a.end - overlap  # each part repeats the end of the one before
        assert a.tokens == chunk  # only the last part may be short


@pytest.mark.parametrize(("chunk", "overlap"), [(0, 0), (10, 10), (10, -1)])
def test_bad_windows(chunk: int, overlap: int):
    with pytest.raises(ValueError):
        chunking.windows(100, chunk, overlap)


def test_longest_message_prefers_the_last_of_equals():
    assert chunking.longest_message([3, 90, 12]) == 1
    assert chunking.longest_message([50, 50]) == 1
    with pytest.raises(ValueError):
        chunking.longest_message([])


def test_prompts_carry_the_request_and_the_state():
    first = chunking.refine_first("Summarise: a b", "PART", 3)
    assert "part 1 now" in first and "Summarise: a b" in first and first.endswith("PART")
    nxt = chunking.refine_next("Summarise: a b", "SO FAR", "PART2", 2, 3)
    assert "Answer so far:\nSO FAR" in nxt and "Part 2 of 3:\nPART2" in nxt
    mapped = chunking.map_part("", "P", 2, 4)
    assert "The request" not in mapped and "Part 2 of 4:\nP" in mapped
    reduced = chunking.reduce_answers("Q", [" one ", "two"])
    assert "1. one\n2. two" in reduced and "read in 2 parts" in reduced
