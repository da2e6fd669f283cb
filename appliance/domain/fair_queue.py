"""One lane's waiting requests, shared fairly between the keys that sent them.

Strict first-come order lets one key's flood starve every other key in the same lane. Here
the next slot goes to the key that is furthest behind for its weight (start-time fair
queueing over grants): each key carries a virtual start tag that advances by 1/weight per
grant, and a key that was idle rejoins at the queue's virtual time, so idling earns no
credit to burst with later. Within one key the order stays first come, first served, so a
single key (or no keys at all) behaves exactly like a FIFO.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _KeyQueue(Generic[T]):
    weight: int
    tag: float  # virtual time of this key's next grant
    items: deque[T] = field(default_factory=deque)


class FairQueue(Generic[T]):
    """Waiters grouped by key; pop() gives the next one by weighted fair share."""

    def __init__(self) -> None:
        self._keys: dict[str, _KeyQueue[T]] = {}
        self._vtime = 0.0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[T]:
        for kq in self._keys.values():
            yield from kq.items

    def heads(self) -> Iterator[T]:
        """The first waiting item of each key."""
        for kq in self._keys.values():
            if kq.items:
                yield kq.items[0]

    def by_key(self) -> dict[str, int]:
        """How many wait, per key (keys with none left out)."""
        return {key: len(kq.items) for key, kq in self._keys.items() if kq.items}

    def push(self, key: str, item: T, weight: int = 1) -> None:
        """Queue item behind key's earlier ones; weight >= 1 is the key's share of grants."""
        if weight < 1:
            raise ValueError(f"weight must be >= 1, got {weight}")
        kq = self._keys.get(key)
        if kq is None:
            kq = self._keys[key] = _KeyQueue(weight, self._vtime)
        elif not kq.items:
            kq.tag = max(kq.tag, self._vtime)  # back from idle: no saved-up credit
        kq.weight = weight
        kq.items.append(item)
        self._len += 1

    def pop(self, eligible: Callable[[T], bool] = lambda head: True) -> T | None:
        """The head item of the key furthest behind whose head is eligible (ties: the key
        queued first); None when no key's head is."""
        best: _KeyQueue[T] | None = None
        for kq in self._keys.values():
            if kq.items and (best is None or kq.tag < best.tag) and eligible(kq.items[0]):
                best = kq
        if best is None:
            return None
        item = best.items.popleft()
        self._len -= 1
        self._vtime = max(self._vtime, best.tag)
        best.tag += 1.0 / best.weight
        self._forget_idle()
        return item

    def remove(self, key: str, item: T) -> bool:
        """Take item out (a request that gave up); False when it is not queued."""
        kq = self._keys.get(key)
        if kq is None:
            return False
        try:
            kq.items.remove(item)
        except ValueError:
            return False
        self._len -= 1
        self._forget_idle()
        return True

    def _forget_idle(self) -> None:
        # An idle key whose tag the virtual time has passed holds nothing worth keeping:
        # dropping it keeps the table as small as the set of keys now waiting.
        for key in [k for k, kq in self._keys.items() if not kq.items and kq.tag <= self._vtime]:
            del self._keys[key]
