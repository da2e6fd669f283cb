"""The thresholds in force: thermal limits and SLOs, from config or the active recalibrated
set, applied live through the owners of each (the telemetry loop's thermal policy, the
controller's settings)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from appliance.config import Config
from appliance.domain.threshold_fit import Thresholds
from appliance.services.control_loop import ControlLoop
from appliance.services.store import StateStore
from appliance.services.telemetry_loop import TelemetryLoop


class LiveThresholds:
    """Reads the thresholds in force and applies a new set, whoever brings it."""

    def __init__(
        self,
        cfg: Config,
        store: StateStore,
        controller: ControlLoop,
        telemetry_loop: TelemetryLoop,
    ) -> None:
        self._cfg = cfg
        self._store = store
        self._controller = controller
        self._telemetry_loop = telemetry_loop
        # The generated Prometheus rules file carrying the recalibrated thresholds.
        self.rules_path: Path = cfg.state_dir / "alerts.recalibrated.yml"

    def configured(self) -> Thresholds:
        """The values config.yaml sets (what applies before any recalibration)."""
        cfg = self._cfg
        return Thresholds(
            derate_core_c=cfg.thermal.derate_core_c,
            protect_mem_c=cfg.thermal.protect_mem_c,
            slo_ttft_p99_s=cfg.slo.ttft_p99_s,
            slo_tpot_p99_s=cfg.slo.tpot_p99_s,
            alert_ttft_p99_s=cfg.slo.ttft_p99_s * 1.5,
            alert_queue_depth=float(max(1, cfg.admission.queue_capacity.interactive // 2)),
        )

    def current(self) -> Thresholds:
        """The active recalibrated set, else the configured values."""
        configured = self.configured()
        active = self._store.active_thresholds()
        if active is None:
            return configured
        # A set stored by an older version may lack a field: it keeps the configured value.
        values: dict[str, Any] = configured.to_dict()
        values.update((k, v) for k, v in active["data"].items() if k in values)
        return Thresholds(**values)

    def apply(self, t: Thresholds, source: str) -> None:
        """Thermal limits to the telemetry loop, SLOs through the controller's one path
        (which resets what the old SLO judged and emits `controller_config`)."""
        loop = self._telemetry_loop
        loop.policy_cfg = dataclasses.replace(
            loop.policy_cfg, derate_core_c=t.derate_core_c, protect_mem_c=t.protect_mem_c
        )
        self._controller.configure(
            slo_ttft_p99_s=t.slo_ttft_p99_s, slo_tpot_p99_s=t.slo_tpot_p99_s, source=source
        )
