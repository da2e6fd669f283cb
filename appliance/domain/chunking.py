"""Long documents in parts (pure): where to cut, and what each pass asks the model.

A chat prompt over the context is read in windows of its longest message, each window
repeating the last `overlap` tokens of the one before so a sentence cut at a border is
seen whole once. The other messages (system prompt, a question asked after the document)
stay as they are in every pass, and the opening of the long message, where the request
usually sits ("Summarise the following: ..."), is carried into every pass as well.

- refine: part 1 is answered, each later part refines the answer so far; the last pass is
  the answer. Sequential by nature, and the answer sees the whole document in order.
- map_reduce: each part is answered alone, then one pass combines the part answers. The
  parts do not see each other, but no part's answer can be lost to a later rewrite.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Strategy(StrEnum):
    REFINE = "refine"
    MAP_REDUCE = "map_reduce"


class Stage(StrEnum):
    """What a pass does: the progress a client and the status page see."""

    REFINE = "refine"
    MAP = "map"
    REDUCE = "reduce"


@dataclass(frozen=True)
class Window:
    """Token offsets [start, end) of one part of the long message."""

    start: int
    end: int

    @property
    def tokens(self) -> int:
        return self.end - self.start


def windows(n_tokens: int, chunk_tokens: int, overlap_tokens: int) -> list[Window]:
    """Cover [0, n_tokens) with windows of chunk_tokens, each overlapping the one before."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens: must be >= 1, got {chunk_tokens}")
    if not 0 <= overlap_tokens < chunk_tokens:
        raise ValueError(
            f"overlap_tokens: must be in [0, chunk_tokens={chunk_tokens}), got {overlap_tokens}"
        )
    if n_tokens <= 0:
        return []
    step = chunk_tokens - overlap_tokens
    out = []
    start = 0
    while True:
        end = min(n_tokens, start + chunk_tokens)
        out.append(Window(start, end))
        if end >= n_tokens:
            return out
        start += step


def longest_message(token_counts: Sequence[int]) -> int:
    """Index of the message to cut (the longest; the last of equals, nearest the question)."""
    if not token_counts:
        raise ValueError("token_counts: at least one message")
    best = 0
    for i, n in enumerate(token_counts):
        if n >= token_counts[best]:
            best = i
    return best


def _head(opening: str) -> str:
    if not opening:
        return ""
    return f"The request, with the start of the document:\n{opening}\n\n"


def refine_first(opening: str, part: str, n_parts: int) -> str:
    """The long message's stand-in for pass 1 of refine."""
    return (
        f"A long document comes in {n_parts} parts; answer the request from part 1 now, "
        "later parts will refine the answer.\n\n"
        f"{_head(opening)}Part 1 of {n_parts}:\n{part}"
    )


def refine_next(opening: str, answer_so_far: str, part: str, index: int, n_parts: int) -> str:
    """The stand-in for pass `index` (1-based, > 1) of refine."""
    return (
        f"A long document comes in {n_parts} parts. Refine the answer so far with part "
        f"{index}; keep what still holds, add what this part changes. Reply with the whole "
        "refined answer only.\n\n"
        f"{_head(opening)}Answer so far:\n{answer_so_far}\n\nPart {index} of {n_parts}:\n{part}"
    )


def map_part(opening: str, part: str, index: int, n_parts: int) -> str:
    """The stand-in for the map pass over part `index` (1-based)."""
    return (
        f"A long document comes in {n_parts} parts. Answer the request for part {index} "
        "alone; say nothing about the other parts.\n\n"
        f"{_head(opening)}Part {index} of {n_parts}:\n{part}"
    )


def reduce_answers(opening: str, answers: Sequence[str]) -> str:
    """The stand-in for the final pass of map_reduce."""
    listed = "\n".join(f"{i}. {a.strip()}" for i, a in enumerate(answers, start=1))
    return (
        f"A long document was read in {len(answers)} parts; these are the answers for each "
        "part. Combine them into one answer to the request.\n\n"
        f"{_head(opening)}Answers per part:\n{listed}"
    )
