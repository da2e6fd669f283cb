"""Priority lanes: realtime before interactive before batch."""

from __future__ import annotations

from enum import IntEnum


class Lane(IntEnum):
    """Lower value is served first."""

    REALTIME = 0
    INTERACTIVE = 1
    BATCH = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: str) -> Lane:
        return cls[value.upper()]


LANE_NAMES = tuple(lane.label for lane in Lane)
