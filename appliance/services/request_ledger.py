"""What each call to a generating endpoint leaves with its key: usage, the settled quota
and one audit record, whatever the call's end (answered, cut, refused, failed)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from appliance.domain.api_keys import KeySpec
from appliance.domain.request_scope import Outcome
from appliance.services.audit_log import AuditLog, AuditRecord, digest
from appliance.services.metrics import Metrics
from appliance.services.quotas import Charge, Quotas
from appliance.services.usage import UsageMeter

log = logging.getLogger("appliance.ledger")

# The key name of a call that presented no valid key (a 401).
UNAUTHENTICATED = "-"
# The request fields that carry the prompt, over every endpoint vLLM serves: the audit log
# hashes these, so the same prompt sent twice has the same hash.
PROMPT_FIELDS = (
    "messages",
    "prompt",
    "input",
    "instructions",
    "query",
    "documents",
    "text_1",
    "text_2",
    "data",
)


def prompt_of(body: dict[str, Any]) -> str:
    """The prompt part of a request body as canonical JSON (sorted keys)."""
    part = {k: body[k] for k in PROMPT_FIELDS if k in body}
    return json.dumps(part, sort_keys=True, ensure_ascii=False, default=str)


@dataclass
class CallRecord:
    """One call, filled in as it goes; the ledger closes it once."""

    endpoint: str
    request_id: str
    arrived_s: float  # time.monotonic()
    arrived_unix_s: float
    key: KeySpec | None = None  # None until the caller is authenticated
    lane: str = "interactive"
    model: str = ""
    prompt: str = ""
    status: str | None = None  # None: answered; set by admission or by the failure
    http_status: int = 200
    outcome: Outcome = field(default_factory=Outcome)
    charge: Charge | None = None
    accounted: bool = False  # admission recorded its metrics already

    @property
    def key_name(self) -> str:
        return UNAUTHENTICATED if self.key is None else self.key.name

    def final_status(self) -> str:
        """The status the usage and the audit record carry."""
        if self.status is not None and self.status != "ok":
            return self.status
        if self.http_status >= 500:
            return "error"
        if self.http_status >= 400:
            return "bad_request"  # vLLM's own 4xx answers (a field it refuses)
        return "ok"


class RequestLedger:
    """Closes calls: usage per key, the quota's estimate settled, the audit record."""

    def __init__(
        self,
        usage: UsageMeter,
        quotas: Quotas,
        audit: AuditLog | None,
        metrics: Metrics,
        clock: Any = time.monotonic,
    ) -> None:
        self._usage = usage
        self._quotas = quotas
        self._audit = audit
        self._metrics = metrics
        self._clock = clock

    def open(self, endpoint: str, arrived_s: float, request_id: str) -> CallRecord:
        """A record for a call that arrived at arrived_s (monotonic)."""
        unix = time.time() - (self._clock() - arrived_s)
        return CallRecord(endpoint, request_id, arrived_s, unix)

    def close(self, call: CallRecord) -> None:
        """Account the call once; never raises (a request never fails for its bookkeeping)."""
        try:
            self._close(call)
        except Exception:
            log.exception("could not account request %s", call.request_id)

    def _close(self, call: CallRecord) -> None:
        status = call.final_status()
        outcome = call.outcome
        prompt_tokens = outcome.prompt_tokens + outcome.extra_prompt_tokens
        completion_tokens = outcome.completion_tokens + outcome.extra_completion_tokens
        if not call.accounted:
            # Refused before admission (401, 403, 400, a key's rate limit): counted here.
            self._metrics.requests_total.labels(status).inc()
        if call.charge is not None:
            self._quotas.settle(call.charge, prompt_tokens + completion_tokens)
        self._usage.record(call.key_name, status, prompt_tokens, completion_tokens)
        if self._audit is None:
            return
        answer = outcome.answer_text()
        reached_engine = outcome.first_token_s is not None or bool(answer)
        self._audit.append(
            AuditRecord(
                time_s=call.arrived_unix_s,
                request_id=call.request_id,
                key_name=call.key_name,
                lane=call.lane,
                endpoint=call.endpoint,
                model=call.model,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                status=status,
                http_status=call.http_status,
                finish_reason=outcome.finish_reason,
                latency_s=self._clock() - call.arrived_s,
                prompt_sha256=digest(call.prompt),
                answer_sha256=digest(answer) if reached_engine else None,
                prompt_text=call.prompt,
                answer_text=answer if reached_engine else None,
            )
        )
