"""The one SSE reader: fields, comments, multi-line data, ids, [DONE], line endings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from appliance.client import SseError, SseEvent, SseParser, aiter_sse, iter_sse, parse_sse

STREAM = (
    ": keep-alive\n"
    "\n"
    "id: 7\n"
    "event: engine_state\n"
    'data: {"kind": "engine_state",\n'
    'data:  "seq": 7}\n'
    "\n"
    "data:no-space\n"
    "retry: 3000\n"
    "unknown: field\n"
    "\n"
    "event: lonely\n"  # an event with no data is not dispatched
    "\n"
    "data: [DONE]\n"
    "\n"
    "data: cut off before its blank line\n"
)
EXPECTED = [
    SseEvent('{"kind": "engine_state",\n "seq": 7}', "engine_state", "7"),
    SseEvent("no-space", "message", "7"),  # the last id stays until changed
    SseEvent("[DONE]", "message", "7"),
]


def test_a_whole_body_with_every_kind_of_line() -> None:
    events = parse_sse(STREAM)
    assert events == EXPECTED
    assert events[0].json() == {"kind": "engine_state", "seq": 7}
    assert [e.done for e in events] == [False, False, True]


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
def test_every_line_ending(ending: str) -> None:
    assert parse_sse(STREAM.replace("\n", ending).encode()) == EXPECTED


def test_lines_from_a_sync_and_an_async_source() -> None:
    lines = STREAM.splitlines(keepends=True)
    assert list(iter_sse(line.rstrip("\n") for line in lines)) == EXPECTED

    async def chunks() -> AsyncIterator[bytes]:
        for line in lines:
            yield line.encode()

    async def collect() -> list[SseEvent]:
        return [e async for e in aiter_sse(chunks())]

    assert asyncio.run(collect()) == EXPECTED


def test_data_keeps_unicode_line_separators() -> None:
    # U+2028 may sit unescaped inside a JSON string; it does not end a line.
    (event,) = parse_sse('data: {"t": "a\u2028b"}\n\n')
    assert event.json() == {"t": "a\u2028b"}


def test_bad_json_names_the_event() -> None:
    parser = SseParser()
    assert parser.feed(b"event: chunk") is None and parser.feed("data: {nope") is None
    event = parser.feed("")
    assert event is not None
    with pytest.raises(SseError, match="event 'chunk': data is not JSON"):
        event.json()
    with pytest.raises(ValueError):  # an SseError is a ValueError for callers that catch those
        event.json()
