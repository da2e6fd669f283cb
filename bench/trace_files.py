"""The trace bench's stored runs as its readers load them: the files a command names, and
which of them ran every run on prompts of its own.

Before `goodput.run_tag`, the arms of a seed replayed the same prompts one after another,
and vLLM's prefix cache gave each later arm the prefill of what the earlier arms had
served: an arm's place in its seed moved its goodput more than the issue's margins. Such a
file recorded no prefix-cache hit ratio. Every reader of the stored runs (trace_pooled,
trace_noise, trace_ceiling, trace_onset) leaves those files out unless it is told
otherwise (--with-shared-cache), and says which it left out.
"""

from __future__ import annotations

import argparse
import glob
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

SHARED_CACHE_FLAG = "--with-shared-cache"


@dataclass(frozen=True)
class StoredRuns:
    """The files a reader was named, and those of them it reads."""

    named: tuple[Path, ...]
    docs: tuple[dict[str, Any], ...]  # the files read, in the order named
    left_out: tuple[str, ...]  # the files not read, as the command names them
    with_shared_cache: bool

    @property
    def flag(self) -> str:
        """The flag as the reader's published command repeats it ("" without it)."""
        return f" {SHARED_CACHE_FLAG}" if self.with_shared_cache else ""

    def notes(self) -> list[str]:
        """What a published section says about the files it read and left out."""
        out = []
        if self.left_out:
            out.append(
                f"Left out, {len(self.left_out)} files whose arms shared the engine's prefix "
                "cache (each seed's arms replayed the same prompts): " + ", ".join(self.left_out)
            )
        hits = max_hit_ratio(self.docs)
        if hits is not None:
            out.append(f"Highest prefix-cache hit ratio of a run read: {hits:.1%}")
        return out

    def markdown_notes(self) -> str:
        """The notes as a published section's closing list ("" without any)."""
        notes = self.notes()
        return "".join(f"\n- {n}" for n in notes) + "\n" if notes else ""

    def none_read(self, what: str) -> SystemExit:
        """The error where no file gave the reader what it needs."""
        return SystemExit(
            f"files: {what}"
            + ("" if self.with_shared_cache else f" on prompts of its own ({SHARED_CACHE_FLAG})")
        )


def prompts_isolated(doc: dict[str, Any]) -> bool:
    """Whether every run of a stored file recorded its prefix-cache hit ratio, as runs on
    prompts of their own do (files from before that have none)."""
    runs = doc.get("runs") or ()
    return bool(runs) and all(r.get("prefix_cache_hit_ratio") is not None for r in runs)


def max_hit_ratio(docs: Iterable[dict[str, Any]]) -> float | None:
    """The highest prefix-cache hit ratio any run of the files recorded."""
    ratios = [
        r["prefix_cache_hit_ratio"]
        for d in docs
        for r in d.get("runs") or ()
        if r.get("prefix_cache_hit_ratio") is not None
    ]
    return max(ratios, default=None)


def shown(path: Path) -> str:
    """A file as a command names it: from the checkout's root where it is under it."""
    full = path.resolve()
    return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else str(path)


def add_shared_cache_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        SHARED_CACHE_FLAG,
        action="store_true",
        help="also read files whose arms replayed the same prompts into one prefix cache",
    )


def load(patterns: Sequence[str], with_shared_cache: bool) -> StoredRuns:
    """The files the patterns match (globs expand here), each once, sorted by name."""
    named = tuple(sorted({Path(f) for pat in patterns for f in glob.glob(pat)}))
    docs, left_out = [], []
    for path in named:
        doc = json.loads(path.read_text())
        if with_shared_cache or prompts_isolated(doc):
            docs.append(doc)
        else:
            left_out.append(shown(path))
    return StoredRuns(named, tuple(docs), tuple(left_out), with_shared_cache)
