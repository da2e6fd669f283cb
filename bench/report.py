"""Each benchmark owns one marked section of docs/benchmarks.md and rewrites only that."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_MD = ROOT / "docs" / "benchmarks.md"


def write_section(doc: Path, name: str, section: str) -> None:
    """Replace the section `name` in doc (between its markers), keeping the others."""
    marker_start, marker_end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{marker_start}\n{section.rstrip()}\n{marker_end}\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    text = doc.read_text() if doc.exists() else "# Benchmarks\n\n"
    if marker_start in text:
        head, rest = text.split(marker_start, 1)
        tail = rest.split(marker_end, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    doc.write_text(text)
