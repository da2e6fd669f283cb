"""Scrape-time Prometheus view of what the daemon aims for and holds to: the controller's live
SLO and each lane's queue capacity, so rules compare what happens with what should."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from appliance.config import LaneConfig
from appliance.domain.lanes import LANE_NAMES
from appliance.services.control_loop import ControlLoop


class TargetCollector:
    """The SLO is read from its one owner (the control loop) at every scrape, so a change
    through PUT /admin/controller shows at the next one."""

    def __init__(self, controller: ControlLoop, queue_capacity: LaneConfig) -> None:
        self._controller = controller
        self._capacity = {lane: int(getattr(queue_capacity, lane)) for lane in LANE_NAMES}

    def collect(self) -> Iterator[Metric]:
        slo = self._controller.cfg
        yield GaugeMetricFamily(
            "appliance_slo_ttft_seconds",
            "The P99 time-to-first-token target the controller holds to",
            value=slo.slo_ttft_p99_s,
        )
        tpot = GaugeMetricFamily(
            "appliance_slo_tpot_seconds",
            "The P99 time-per-output-token target (absent while TPOT is not guarded)",
        )
        if slo.slo_tpot_p99_s is not None:
            tpot.add_metric([], slo.slo_tpot_p99_s)
        yield tpot
        capacity = GaugeMetricFamily(
            "appliance_queue_capacity",
            "How many requests a lane holds waiting before it answers 429",
            labels=["priority"],
        )
        for lane, size in self._capacity.items():
            capacity.add_metric([lane], size)
        yield capacity
