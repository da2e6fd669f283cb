"""What every finished request leaves behind: Prometheus counters and histograms, the
controller's latency window, and one `request_done` log line."""

from __future__ import annotations

import logging
import time

from appliance.domain.lanes import Lane
from appliance.domain.latency_window import LatencyWindow
from appliance.domain.request_scope import Outcome
from appliance.json_log import request_id_var
from appliance.services.metrics import Metrics
from appliance.services.slo import SloMeter

log = logging.getLogger("appliance.requests")


class RequestAccounting:
    """Records one request's outcome once, whatever endpoint served it."""

    def __init__(
        self, metrics: Metrics, latency: LatencyWindow, slo: SloMeter | None = None
    ) -> None:
        self._metrics = metrics
        self._latency = latency
        self._slo = slo

    def record(
        self, lane: Lane, kind: str, outcome: Outcome, arrived_s: float, status: str
    ) -> None:
        m = self._metrics
        m.requests_total.labels(status).inc()
        if self._slo is not None:
            self._slo.record_request(status)
        if status == "rejected":
            m.rejected += 1
        elif status != "not_ready":
            m.finished += 1
        if status in ("deadline", "deadline_queued"):
            stage = "queued" if status == "deadline_queued" else "generating"
            m.deadline_expired_total.labels(lane.label, stage).inc()
        m.prompt_tokens_total.inc(outcome.prompt_tokens)
        completion = outcome.completion_tokens + outcome.extra_completion_tokens
        m.generated_tokens_total.inc(completion)
        m.generated_tokens += completion
        tpot = self._latencies(outcome, arrived_s, status)
        e2e = time.monotonic() - arrived_s
        m.e2e_seconds.observe(e2e)
        # One line per request: what `appliance logs analyze` ties latency spikes to.
        log.info(
            "request done",
            extra={
                "event": "request_done",
                "request_id": request_id_var.get(),
                "ev_status": status,
                "ev_priority": lane.label,
                "ev_kind": kind,
                "ev_prompt_tokens": outcome.prompt_tokens,
                "ev_completion_tokens": completion,
                "ev_finish_reason": outcome.finish_reason,
                "ev_queue_wait_s": _round(outcome.admitted_s, arrived_s),
                "ev_ttft_s": _round(outcome.first_token_s, arrived_s),
                "ev_tpot_s": None if tpot is None else round(tpot, 6),
                "ev_e2e_s": round(e2e, 6),
            },
        )

    def _latencies(self, outcome: Outcome, arrived_s: float, status: str) -> float | None:
        """Observe TTFT and TPOT; feed the controller's window; the TPOT, if any."""
        if outcome.first_token_s is None:
            return None
        m = self._metrics
        tpot: float | None = None
        m.ttft_seconds.observe(outcome.first_token_s - arrived_s)
        if outcome.completion_tokens > 1 and outcome.last_token_s is not None:
            tpot = (outcome.last_token_s - outcome.first_token_s) / (outcome.completion_tokens - 1)
            m.tpot_seconds.observe(tpot)
        if status == "ok" and outcome.admitted_s is not None and outcome.long_context is None:
            # The controller judges the engine, so its TTFT starts at admission: queue wait
            # grows when the limit shrinks, and counting it would cut the limit to the floor.
            # A chunked document's first token comes after all its parts: not a TTFT either.
            self._latency.add(
                time.monotonic(),
                outcome.first_token_s - outcome.admitted_s,
                tpot,
                admitted_s=outcome.admitted_s,
            )
        return tpot


def _round(at_s: float | None, since_s: float) -> float | None:
    return None if at_s is None else round(at_s - since_s, 6)
