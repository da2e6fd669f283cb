"""Server-sent events: the one reader for every stream the daemon or an OpenAI server sends.

It follows the WHATWG event-stream rules: `data:` lines join with newlines, `event:` names
the event (default "message"), `id:` sets the last event id (kept until changed), a line
starting with `:` is a comment (keep-alives), and a blank line ends the event. An event with
no data is not dispatched, and neither is one a stream cut off before its blank line. `retry:`
and unknown fields are ignored. OpenAI's end-of-stream marker is the data `[DONE]`.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

DONE = "[DONE]"
# The three line endings the format allows; str.splitlines would also split on U+2028 and
# friends, which JSON may carry unescaped inside a data line.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class SseError(ValueError):
    """An event's data is not what the reader was asked to decode."""


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event."""

    data: str
    event: str = "message"
    id: str | None = None

    @property
    def done(self) -> bool:
        """True for OpenAI's `data: [DONE]`, the last event of a completion stream."""
        return self.data == DONE

    def json(self) -> Any:
        """The data decoded as JSON; SseError names the event when it is not JSON."""
        try:
            return json.loads(self.data)
        except ValueError:
            raise SseError(
                f"event {self.event!r}: data is not JSON: {self.data[:200]!r}"
            ) from None


class SseParser:
    """Fed one line at a time (str or bytes, line ending or not); returns each finished event."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event: str | None = None
        self._last_id: str | None = None

    def feed(self, line: str | bytes) -> SseEvent | None:
        """Take one line; the event it completes, else None."""
        if isinstance(line, bytes):
            line = line.decode("utf-8", errors="replace")
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._last_id = value
        return None

    def _dispatch(self) -> SseEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], None
        if not data:
            return None
        return SseEvent("\n".join(data), event or "message", self._last_id)


def iter_sse(lines: Iterable[str | bytes]) -> Iterator[SseEvent]:
    """The events of a stream given as lines (e.g. requests' `iter_lines()`)."""
    parser = SseParser()
    for line in lines:
        event = parser.feed(line)
        if event is not None:
            yield event


async def aiter_sse(lines: AsyncIterable[str | bytes]) -> AsyncIterator[SseEvent]:
    """The events of a stream read line by line (e.g. an aiohttp response's `content`)."""
    parser = SseParser()
    async for line in lines:
        event = parser.feed(line)
        if event is not None:
            yield event


def parse_sse(body: str | bytes) -> list[SseEvent]:
    """Every event of a whole stream body."""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    # What follows the last line break is no line yet (empty, or a line cut off).
    return list(iter_sse(_LINE_BREAK.split(text)[:-1]))
