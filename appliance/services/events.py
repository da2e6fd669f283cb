"""State-change events: logged as JSON, kept in a ring, fanned out to SSE subscribers."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger("appliance.events")


@dataclass(frozen=True)
class Event:
    """Something the daemon did or saw, with the reason."""

    seq: int
    ts_s: float
    kind: str
    reason: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class EventBus:
    """Publishes events; each subscriber has its own bounded queue: a slow reader stalls nobody."""

    def __init__(self, history: int = 500, subscriber_queue: int = 256) -> None:
        self._seq = itertools.count(1)
        self._recent: deque[Event] = deque(maxlen=history)
        self._subscribers: set[asyncio.Queue[Event | None]] = set()
        self._subscriber_queue = subscriber_queue
        self._sinks: list[Callable[[Event], None]] = []
        self._closed = False

    def add_sink(self, sink: Callable[[Event], None]) -> None:
        """Also hand every event to sink (e.g. the state store)."""
        self._sinks.append(sink)

    def emit(self, kind: str, reason: str, **data: Any) -> Event:
        """Record an event and deliver it to every subscriber."""
        event = Event(next(self._seq), time.time(), kind, reason, data)
        self._recent.append(event)
        log.info(
            reason,
            extra={"event": kind, "reason": reason, **{f"ev_{k}": v for k, v in data.items()}},
        )
        for queue in self._subscribers:
            if queue.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()  # drop the oldest for a reader that fell behind
            queue.put_nowait(event)
        for sink in self._sinks:
            try:
                sink(event)
            except Exception:  # a broken sink must not break the daemon
                log.exception("event sink failed")
        return event

    def recent(self, limit: int = 100) -> list[Event]:
        """The newest events, oldest first."""
        return list(self._recent)[-limit:]

    def close(self) -> None:
        """End every subscription (shutdown: SSE streams finish instead of holding it up)."""
        self._closed = True
        for queue in self._subscribers:
            if queue.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
            queue.put_nowait(None)

    async def subscribe(self) -> AsyncIterator[Event]:
        """Yield events as they happen until the consumer stops or the bus closes."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue(self._subscriber_queue)
        if self._closed:
            return
        self._subscribers.add(queue)
        try:
            while (event := await queue.get()) is not None:
                yield event
        finally:
            self._subscribers.discard(queue)
