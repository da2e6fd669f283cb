"""Load generator for any OpenAI-compatible endpoint: a concurrency sweep, measured by streaming.

Each level runs `concurrency` closed-loop workers over a fixed number of requests (like
vLLM's `--max-concurrency`), every request a streamed chat completion, so TTFT is the time
to the first content chunk and TPOT the time per token after it. When the endpoint is an
appliance and an admin token is given, `GET /admin/status` is polled during each level for
KV-cache usage, the daemon's concurrency limit and GPU utilisation and energy.

Scenarios: `chat` (short prompts), `document` (prompts near the context limit, sized from
`max_model_len` in `GET /v1/models` and the endpoint's own token counts) and `mixed` (a
quarter documents). Results are frozen dataclasses with `to_dict()`; the knee, Pareto front
and scores come from `appliance.domain.sweep_analysis`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from appliance.client import AdminClient, AdminError, Token, aiter_sse
from appliance.domain.latency_window import percentile
from appliance.domain.sweep_analysis import (
    Knee,
    ScoreResult,
    ScoreWeights,
    Slo,
    SweepPoint,
    TuningResult,
    find_knee,
    next_extension,
    next_tuning_level,
    pareto_front,
    tuning_result,
    weighted_score,
)

SCENARIOS = ("chat", "document", "mixed")
DEFAULT_MAX_MODEL_LEN = 2048
# A document fills this share of what the context leaves after the output tokens: near the
# limit, with room for tokenizer differences between calibration and the real prompt.
DOCUMENT_FILL = 0.9


class BenchError(Exception):
    """The benchmark cannot run (bad settings, endpoint unreachable, nothing succeeded)."""


@dataclass(frozen=True)
class BenchSettings:
    """What to run: endpoint, scenario, levels, and how much work per level."""

    url: str
    scenario: str = "chat"
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    requests_per_level: int | None = None  # None: max(8, 2 x level); never below the level
    max_tokens: int = 64
    model: str | None = None  # None: the first model of GET /v1/models
    api_key: str | None = None
    admin_token: str | None = None
    request_timeout_s: float = 600.0
    warmup_requests: int = 1
    seed: int = 0
    document_share: float = 0.25  # mixed scenario
    telemetry_interval_s: float = 1.0
    temperature: float = 0.8
    # A sweep still rising at its largest level doubles upward to this level (the engine's
    # max_num_seqs) before the knee is judged; None: measure only `concurrency`.
    extend_to: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if not self.url.startswith(("http://", "https://")):
            problems.append(f"url: must start with http:// or https://, got {self.url!r}")
        if self.scenario not in SCENARIOS:
            problems.append(
                f"scenario: must be one of {', '.join(SCENARIOS)}, got {self.scenario!r}"
            )
        if not self.concurrency:
            problems.append("concurrency: need at least one level")
        elif any(c < 1 for c in self.concurrency):
            problems.append("concurrency: each level must be >= 1")
        elif len(set(self.concurrency)) != len(self.concurrency):
            dup = next(c for c in self.concurrency if self.concurrency.count(c) > 1)
            problems.append(f"concurrency: level {dup} appears more than once")
        if self.requests_per_level is not None and self.requests_per_level < 1:
            problems.append(f"requests-per-level: must be >= 1, got {self.requests_per_level}")
        if self.max_tokens < 1:
            problems.append(f"max-tokens: must be >= 1, got {self.max_tokens}")
        if not self.request_timeout_s > 0:
            problems.append(f"request_timeout_s: must be > 0, got {self.request_timeout_s}")
        if self.warmup_requests < 0:
            problems.append(f"warmup_requests: must be >= 0, got {self.warmup_requests}")
        if not 0 < self.document_share <= 1:
            problems.append(f"document_share: must be in (0, 1], got {self.document_share}")
        if not self.telemetry_interval_s > 0:
            problems.append(f"telemetry_interval_s: must be > 0, got {self.telemetry_interval_s}")
        if not 0 <= self.temperature <= 2:
            problems.append(f"temperature: must be in [0, 2], got {self.temperature}")
        if self.extend_to is not None and self.extend_to < 1:
            problems.append(f"extend-to: must be >= 1, got {self.extend_to}")
        if problems:
            raise ValueError("; ".join(problems))

    def requests_at(self, level: int) -> int:
        """Requests to send at a level: every worker gets at least one."""
        n = self.requests_per_level if self.requests_per_level is not None else max(8, 2 * level)
        return max(n, level)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, without the secrets."""
        out = asdict(self)
        out["concurrency"] = list(self.concurrency)
        out["api_key"] = "***" if self.api_key else None
        out["admin_token"] = "***" if self.admin_token else None
        return out


@dataclass(frozen=True)
class RequestSample:
    """One request as the client saw it."""

    ok: bool
    kind: str  # chat | document
    status: int  # HTTP status; 0 when no response came
    error: str | None
    prompt_tokens: int | None
    completion_tokens: int
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float
    started_s: float  # on the runner's perf_counter clock


@dataclass(frozen=True)
class TelemetrySummary:
    """What /admin/status showed during one level."""

    readings: int
    kv_cache_usage_max_ratio: float | None
    daemon_limit_min: int | None
    daemon_limit_max: int | None
    utilisation: float | None  # mean GPU utilisation 0..1
    energy_j: float | None
    simulated: bool  # the GPU numbers come from the simulator, not a device


@dataclass(frozen=True)
class LevelResult:
    """One concurrency level: counts, timing, the sweep point, and what went wrong."""

    concurrency: int
    requests: int
    ok: int
    failed: int
    documents: int  # of the requests, how many were document prompts
    duration_s: float
    output_tokens: int
    prompt_tokens_mean: float | None
    e2e_p50_s: float | None
    point: SweepPoint | None  # None when no request succeeded
    errors: tuple[str, ...]  # distinct messages, at most 5
    telemetry: TelemetrySummary | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        out = asdict(self)
        out["errors"] = list(self.errors)
        return out


@dataclass(frozen=True)
class BenchReport:
    """A finished sweep with its analysis."""

    url: str
    model: str
    scenario: str
    max_model_len: int | None
    settings: BenchSettings
    started_at_unix_s: float
    duration_s: float
    levels: tuple[LevelResult, ...]
    knee: Knee | None
    pareto: tuple[int, ...]  # concurrency levels on the front
    scores: ScoreResult | None
    slo: Slo | None
    tuning: TuningResult | None
    notes: tuple[str, ...]
    # The daemon's own limit when it capped a level at or below the knee: the sweep then
    # measured that limit, not the engine, and its knee must not become the ceiling.
    capped_by_daemon_limit: int | None = None

    @property
    def points(self) -> list[SweepPoint]:
        """Sweep points of the levels where something succeeded."""
        return [lv.point for lv in self.levels if lv.point is not None]

    @property
    def knee_limit(self) -> int | None:
        """The ceiling to hand to the controller (the tuning's limit, else the knee).

        None when the daemon's own limit capped the sweep at the knee (a ceiling learnt from
        a capped sweep would only ever confirm the cap), and when throughput still rose at
        the largest level.
        """
        if self.capped_by_daemon_limit is not None:
            return None
        if self.tuning is not None:
            return self.tuning.recommended_limit
        if self.knee is None or self.knee.still_rising:
            return None  # still rising at the largest level: a ceiling there would cap it
        return self.knee.concurrency

    @property
    def lifts_ceiling(self) -> bool:
        """True when the sweep showed that no ceiling is right: throughput still rose at the
        largest level, uncapped by the daemon. An earlier, lower ceiling must then go."""
        knee = self.tuning.knee if self.tuning is not None else self.knee
        return self.capped_by_daemon_limit is None and knee is not None and knee.still_rising

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (what `appliance bench --json` prints)."""
        return {
            "url": self.url,
            "model": self.model,
            "scenario": self.scenario,
            "max_model_len": self.max_model_len,
            "settings": self.settings.to_dict(),
            "started_at_unix_s": self.started_at_unix_s,
            "duration_s": self.duration_s,
            "levels": [lv.to_dict() for lv in self.levels],
            "knee": self.knee.to_dict() if self.knee else None,
            "knee_limit": self.knee_limit,
            "pareto": list(self.pareto),
            "scores": self.scores.to_dict() if self.scores else None,
            "slo": asdict(self.slo) if self.slo else None,
            "tuning": self.tuning.to_dict() if self.tuning else None,
            "notes": list(self.notes),
            "capped_by_daemon_limit": self.capped_by_daemon_limit,
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)


@dataclass(frozen=True)
class Progress:
    """A progress report: `done` of `total` requests at `level` (phase warmup|level|done)."""

    phase: str
    level: int | None
    level_index: int
    levels_total: int
    done: int
    total: int
    failed: int = 0


ProgressFn = Callable[[Progress], None]

# -- prompts ------------------------------------------------------------------------------

# Plain common words: each costs about the same tokens anywhere in a prompt (document sizing
# scales a calibrated tokens-per-word figure).
_WORD_TEXT = """
the system river mountain engine signal market garden window letter music history village
forest ocean bridge station quiet bright ancient modern careful sudden teacher doctor farmer
pilot painter sailor writer builder merchant child friend stranger morning evening winter
summer autumn spring storm light shadow fire water stone iron silver golden wooden glass
paper cloth bread apple honey salt coffee road city harbour castle tower library museum
school factory office kitchen field valley island travels builds finds carries watches
remembers forgets opens closes follows explains discovers protects answers changes grows
slowly quickly gently always never often because although while after before during under
over between across through
"""
_WORDS = tuple(_WORD_TEXT.split())
_TOPICS = (
    "a lighthouse keeper",
    "a robot learning to paint",
    "two rival bakers",
    "a lost map",
    "the last train of the night",
    "a city under the sea",
    "a clockmaker's apprentice",
    "a dragon who collects books",
)
_CHAT_TEMPLATES = (
    "Write a long story about {topic}.",
    "Tell me in detail how {topic} changed a small town.",
    "Describe a day in the life of {topic}, step by step.",
    "Write a detailed letter from {topic} to an old friend.",
)


def _text(rng: random.Random, words: int) -> str:
    out = []
    for i in range(words):
        w = rng.choice(_WORDS)
        out.append(w + ("." if i % 14 == 13 else ""))
    return " ".join(out)


def chat_prompt(index: int, seed: int) -> str:
    """A short prompt (10-30 words) asking for a long answer; deterministic per index."""
    rng = random.Random(seed * 1_000_003 + index)
    template = rng.choice(_CHAT_TEMPLATES)
    detail = _text(rng, rng.randint(4, 20))
    return f"{template.format(topic=rng.choice(_TOPICS))} Include: {detail}"


def document_prompt(index: int, seed: int, words: int) -> str:
    """A long prompt: a document of about `words` words and a request to summarise it."""
    rng = random.Random(seed * 1_000_003 + index + 7_777_777)
    return f"Summarise the following document in a few sentences.\n\n{_text(rng, words)}"


def is_document(index: int, scenario: str, share: float) -> bool:
    """Which requests of a level are documents: all, none, or an exact share for mixed."""
    if scenario == "document":
        return True
    if scenario == "chat":
        return False
    return math.floor((index + 1) * share) > math.floor(index * share)


# -- one request --------------------------------------------------------------------------


@dataclass
class Target:
    """The endpoint: base URL, model, context length, headers; built by `connect`."""

    url: str
    model: str
    max_model_len: int | None
    headers: dict[str, str]
    document_words: int | None = None
    notes: list[str] = field(default_factory=list)


def _error_text(status: int, body: str) -> str:
    try:
        doc = json.loads(body)
        message = doc.get("error", {}).get("message") if isinstance(doc, dict) else None
    except ValueError:
        message = None
    return f"HTTP {status}: {message or body[:200].strip() or 'no body'}"


def chat_body(
    model: str,
    prompt: str,
    max_tokens: int,
    temperature: float = 0.8,
    seed: int | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A streamed chat completion that reports its usage at the end."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        # vLLM honours it (every request runs to max_tokens); other servers ignore it.
        "ignore_eos": True,
    }
    if seed is not None:
        body["seed"] = seed
    if extra:
        body.update(extra)
    return body


@dataclass
class _StreamTimes:
    """What one stream's chunks showed: first and last content, chunk count, usage, error."""

    t0: float
    first: float | None = None
    last: float | None = None
    chunks: int = 0
    usage: dict[str, Any] | None = None
    error: str | None = None

    def take(self, chunk: Any, now: float) -> None:
        """One decoded chunk, seen at `now`."""
        if not isinstance(chunk, dict):
            return
        if "error" in chunk:
            err = chunk["error"]
            self.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            return
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content") or choice.get("text"):
                self.first = now if self.first is None else self.first
                self.last = now
                self.chunks += 1

    def sample(self, kind: str, status: int, end: float) -> RequestSample:
        """The request as a sample: ok when content came and nothing failed."""
        usage = self.usage
        tokens = int(usage.get("completion_tokens") or 0) if usage else self.chunks
        prompt_tokens = int(usage["prompt_tokens"]) if usage and "prompt_tokens" in usage else None
        error = self.error
        if error is None and self.first is None:
            error = "the stream carried no content"
        ttft = self.first - self.t0 if self.first is not None else None
        tpot = None
        if self.first is not None and self.last is not None and tokens > 1:
            tpot = (self.last - self.first) / (tokens - 1)
        ok = error is None
        return RequestSample(
            ok, kind, status, error, prompt_tokens, tokens, ttft, tpot, end - self.t0, self.t0
        )


async def stream_chat(
    session: aiohttp.ClientSession,
    target: Target,
    prompt: str,
    max_tokens: int,
    kind: str = "chat",
    temperature: float = 0.8,
    seed: int | None = None,
    extra: dict[str, Any] | None = None,
) -> RequestSample:
    """Send one streamed chat completion; time its first and last content chunks."""
    body = chat_body(target.model, prompt, max_tokens, temperature, seed, extra)
    times = _StreamTimes(time.perf_counter())
    status = 0
    try:
        async with session.post(
            target.url + "/v1/chat/completions", json=body, headers=target.headers
        ) as resp:
            status = resp.status
            if status != 200:
                times.error = _error_text(status, await resp.text())
                return times.sample(kind, status, time.perf_counter())
            async for event in aiter_sse(resp.content):
                if event.done:
                    break
                times.take(event.json(), time.perf_counter())
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        times.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return times.sample(kind, status, time.perf_counter())


async def _prompt_tokens(session: aiohttp.ClientSession, target: Target, prompt: str) -> int | None:
    """The endpoint's own count of a prompt's tokens (a 1-token completion); None if refused."""
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 1,
        "temperature": 0.0,
    }
    async with session.post(
        target.url + "/v1/chat/completions", json=body, headers=target.headers
    ) as resp:
        if resp.status != 200:
            return None
        doc = await resp.json()
    usage = doc.get("usage") or {}
    return int(usage["prompt_tokens"]) if "prompt_tokens" in usage else None


async def size_documents(
    session: aiohttp.ClientSession, target: Target, max_tokens: int, seed: int
) -> int:
    """How many words make a document prompt fill DOCUMENT_FILL of the context left.

    Calibrated on the endpoint: two 1-token requests give tokens per word and the chat
    template's overhead; a check request at the chosen size must be accepted (else shrink).
    """
    max_len = target.max_model_len or DEFAULT_MAX_MODEL_LEN
    if target.max_model_len is None:
        target.notes.append(
            f"max_model_len: not in GET /v1/models; documents sized for {DEFAULT_MAX_MODEL_LEN}"
        )
    budget = max_len - max_tokens
    if budget < 16:
        raise BenchError(
            f"max-tokens: {max_tokens} leaves {budget} tokens of the {max_len}-token context "
            "for a document prompt; use a smaller --max-tokens"
        )
    # The long sample must itself fit a small context (about 1.5 tokens a word at most).
    short_words = 10
    long_words = max(short_words + 10, min(200, int(budget / 2)))
    short = await _prompt_tokens(session, target, document_prompt(0, seed, short_words))
    long = await _prompt_tokens(session, target, document_prompt(0, seed, long_words))
    if short is None or long is None or long <= short:
        per_word, overhead = 1.5, 32.0
        target.notes.append("document sizing: no token counts from the endpoint; assumed 1.5/word")
    else:
        per_word = (long - short) / (long_words - short_words)
        overhead = short - short_words * per_word
    words = max(1, int((DOCUMENT_FILL * budget - overhead) / per_word))
    for _ in range(6):
        n = await _prompt_tokens(session, target, document_prompt(0, seed, words))
        if n is not None and n + max_tokens <= max_len:
            return words
        words = max(1, int(words * 0.85))
    raise BenchError(
        f"document: the endpoint refused even a {words}-word document with max-tokens "
        f"{max_tokens} (context {max_len} tokens)"
    )


async def connect(session: aiohttp.ClientSession, settings: BenchSettings) -> Target:
    """Find the model and its context length (GET /v1/models)."""
    url = settings.url.rstrip("/")
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    try:
        async with session.get(url + "/v1/models", headers=headers) as resp:
            if resp.status != 200:
                raise BenchError(f"{url}/v1/models: {_error_text(resp.status, await resp.text())}")
            doc = await resp.json()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise BenchError(f"{url}: not reachable ({type(exc).__name__}: {exc})") from None
    models = doc.get("data") or []
    if not models:
        raise BenchError(f"{url}/v1/models: no model served")
    entry = models[0]
    if settings.model is not None:
        entry = next((m for m in models if m.get("id") == settings.model), None)
        if entry is None:
            served = ", ".join(str(m.get("id")) for m in models)
            raise BenchError(f"model: {settings.model!r} is not served at {url} (serves {served})")
    max_len = entry.get("max_model_len")
    return Target(url, str(entry["id"]), int(max_len) if max_len else None, headers)


# -- telemetry ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Reading:
    kv_ratio: float | None
    limit: int | None
    util_pct: float | None
    energy_j: float | None
    simulated: bool


def parse_status(doc: dict[str, Any]) -> _Reading:
    """The numbers the bench uses from an /admin/status snapshot (each may be missing)."""
    engine = doc.get("engine") or {}
    stats = engine.get("stats") or {}
    adm = doc.get("admission") or {}
    telemetry = doc.get("telemetry")
    if not isinstance(telemetry, dict):
        telemetry = {}
    gpus = telemetry.get("gpus")
    if gpus is None:
        gpus = doc.get("gpus") or []
    utils = [g["gpu_util_pct"] for g in gpus if g.get("gpu_util_pct") is not None]
    # The daemon's own running total survives counter resets; per-GPU counters are the fallback.
    energy = telemetry.get("energy_total_j")
    if energy is None:
        energies = [g.get("energy_j") for g in gpus]
        if gpus and None not in energies:
            energy = sum(energies)
    kv = stats.get("kv_cache_usage_ratio")
    return _Reading(
        kv_ratio=float(kv) if kv is not None else None,
        limit=int(adm["limit"]) if adm.get("limit") is not None else None,
        util_pct=sum(utils) / len(utils) if utils else None,
        energy_j=float(energy) if energy is not None else None,
        simulated=bool(gpus)
        and (bool(telemetry.get("simulated")) or any(bool(g.get("simulated")) for g in gpus)),
    )


class _TelemetryPoller:
    """Polls GET /admin/status while a level runs; switches itself off when a call fails."""

    def __init__(self, admin: AdminClient | None, interval_s: float) -> None:
        self._admin = admin
        self._interval_s = interval_s
        self.enabled = admin is not None
        self.note: str | None = None if admin else "telemetry: no admin token, none collected"
        self._readings: list[_Reading] = []
        self._task: asyncio.Task[None] | None = None

    async def read_once(self) -> None:
        if not self.enabled or self._admin is None:
            return
        try:
            doc = await self._admin.status()
        except AdminError as exc:
            # Any OpenAI endpoint may be benchmarked: one without the admin API is no error.
            self.enabled = False
            self.note = f"telemetry: off, {exc.message}"
            return
        self._readings.append(parse_status(doc))

    async def _loop(self) -> None:
        while self.enabled:
            await asyncio.sleep(self._interval_s)
            await self.read_once()

    async def start(self) -> None:
        self._readings = []
        await self.read_once()
        if self.enabled:
            self._task = asyncio.create_task(self._loop(), name="bench-telemetry")

    async def stop(self) -> TelemetrySummary | None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.read_once()  # the energy counter at the very end of the level
        rs = self._readings
        if not rs:
            return None
        kvs = [r.kv_ratio for r in rs if r.kv_ratio is not None]
        limits = [r.limit for r in rs if r.limit is not None]
        utils = [r.util_pct for r in rs if r.util_pct is not None]
        energy = None
        if len(rs) >= 2 and rs[0].energy_j is not None and rs[-1].energy_j is not None:
            energy = max(0.0, rs[-1].energy_j - rs[0].energy_j)
        return TelemetrySummary(
            readings=len(rs),
            kv_cache_usage_max_ratio=max(kvs) if kvs else None,
            daemon_limit_min=min(limits) if limits else None,
            daemon_limit_max=max(limits) if limits else None,
            utilisation=min(1.0, sum(utils) / len(utils) / 100) if utils else None,
            energy_j=energy,
            simulated=any(r.simulated for r in rs),
        )


# -- a level and a sweep ------------------------------------------------------------------


def summarise(
    level: int, samples: Sequence[RequestSample], duration_s: float, tel: TelemetrySummary | None
) -> LevelResult:
    """Turn one level's samples into its sweep point (None when nothing succeeded)."""
    ok = [s for s in samples if s.ok]
    failed = [s for s in samples if not s.ok]
    errors = tuple(dict.fromkeys(s.error or "unknown error" for s in failed))[:5]
    out_tokens = sum(s.completion_tokens for s in ok)
    prompt_counts = [s.prompt_tokens for s in ok if s.prompt_tokens is not None]
    point = None
    e2e_p50 = None
    if ok:
        ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
        # One-token answers have no TPOT; count them as 0 rather than lose the level.
        tpot = [s.tpot_s for s in ok if s.tpot_s is not None] or [0.0]
        e2e = [s.e2e_s for s in ok]
        e2e_p50 = percentile(e2e, 50)
        duration = max(duration_s, 1e-9)
        energy_per_token = None
        if tel is not None and tel.energy_j is not None and out_tokens > 0:
            energy_per_token = tel.energy_j / out_tokens
        point = SweepPoint(
            concurrency=level,
            output_tok_s=out_tokens / duration,
            request_per_s=len(ok) / duration,
            ttft_p50_s=percentile(ttft, 50),
            ttft_p99_s=percentile(ttft, 99),
            tpot_p50_s=percentile(tpot, 50),
            tpot_p99_s=percentile(tpot, 99),
            e2e_p99_s=percentile(e2e, 99),
            utilisation=tel.utilisation if tel else None,
            energy_j_per_token=energy_per_token,
        )
    return LevelResult(
        concurrency=level,
        requests=len(samples),
        ok=len(ok),
        failed=len(failed),
        documents=sum(s.kind == "document" for s in samples),
        duration_s=duration_s,
        output_tokens=out_tokens,
        prompt_tokens_mean=sum(prompt_counts) / len(prompt_counts) if prompt_counts else None,
        e2e_p50_s=e2e_p50,
        point=point,
        errors=errors,
        telemetry=tel,
    )


class BenchRunner:
    """Runs levels against one endpoint with one HTTP session; use as an async context."""

    def __init__(self, settings: BenchSettings, progress: ProgressFn | None = None) -> None:
        self.settings = settings
        self._progress = progress
        self._session: aiohttp.ClientSession | None = None
        self.target: Target | None = None
        self._admin: AdminClient | None = None
        self._poller: _TelemetryPoller | None = None
        self._levels_total = len(settings.concurrency)
        self._level_index = 0

    async def __aenter__(self) -> BenchRunner:
        s = self.settings
        timeout = aiohttp.ClientTimeout(total=s.request_timeout_s, sock_connect=10)
        # limit=0: the connector must never be what caps the concurrency under test.
        self._session = aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
        )
        try:
            self.target = await connect(self._session, s)
            if s.scenario in ("document", "mixed"):
                self.target.document_words = await size_documents(
                    self._session, self.target, s.max_tokens, s.seed
                )
        except BaseException:
            await self._session.close()
            raise
        if s.admin_token:
            token = Token(s.admin_token, "the admin token given to the bench")
            self._admin = AdminClient(self.target.url, token)
        self._poller = _TelemetryPoller(self._admin, s.telemetry_interval_s)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._admin is not None:
            await self._admin.close()
        if self._session is not None:
            await self._session.close()

    def _emit(self, phase: str, level: int | None, done: int, total: int, failed: int) -> None:
        if self._progress is not None:
            self._progress(
                Progress(phase, level, self._level_index, self._levels_total, done, total, failed)
            )

    async def _one(self, index: int, max_tokens: int | None = None) -> RequestSample:
        assert self._session is not None and self.target is not None
        s = self.settings
        doc = is_document(index, s.scenario, s.document_share)
        if doc:
            assert self.target.document_words is not None
            prompt = document_prompt(index, s.seed, self.target.document_words)
        else:
            prompt = chat_prompt(index, s.seed)
        return await stream_chat(
            self._session,
            self.target,
            prompt,
            max_tokens or s.max_tokens,
            kind="document" if doc else "chat",
            temperature=s.temperature,
            seed=s.seed * 100_003 + index,
        )

    def expect_levels(self, total: int) -> None:
        """Tell progress reports how many levels to expect (the tuning learns it as it goes)."""
        self._levels_total = max(total, self._level_index)

    async def warmup(self) -> list[RequestSample]:
        """A few requests before measuring, so first-request costs stay out of the numbers."""
        n = self.settings.warmup_requests
        self._emit("warmup", None, 0, n, 0)
        out = [
            await self._one(-1 - i, max_tokens=min(8, self.settings.max_tokens)) for i in range(n)
        ]
        self._emit("warmup", None, n, n, sum(not s.ok for s in out))
        return out

    async def run_level(self, level: int) -> LevelResult:
        """Run one level: `level` workers over requests_at(level) requests."""
        assert self._poller is not None
        n = self.settings.requests_at(level)
        self._level_index += 1
        self._levels_total = max(self._levels_total, self._level_index)
        indices = iter(range(n))
        samples: list[RequestSample] = []
        self._emit("level", level, 0, n, 0)

        async def worker() -> None:
            for i in indices:  # shared iterator: each index is taken once
                sample = await self._one(level * 100_000 + i)
                samples.append(sample)
                self._emit("level", level, len(samples), n, sum(not s.ok for s in samples))

        await self._poller.start()
        t0 = time.perf_counter()
        try:
            await asyncio.gather(*(worker() for _ in range(level)))
        finally:
            duration = time.perf_counter() - t0
            tel = await self._poller.stop()
        return summarise(level, samples, duration, tel)

    def notes(self) -> list[str]:
        """What the reader of the report should know about how it was measured."""
        out = list(self.target.notes) if self.target else []
        if self._poller is not None and self._poller.note:
            out.append(self._poller.note)
        return out


def _assemble(
    runner: BenchRunner,
    levels: list[LevelResult],
    started_unix: float,
    t0: float,
    slo: Slo | None,
    weights: ScoreWeights | None,
    tuning: TuningResult | None,
) -> BenchReport:
    assert runner.target is not None
    notes = runner.notes()
    points = [lv.point for lv in levels if lv.point is not None]
    for lv in levels:
        if lv.failed:
            notes.append(
                f"level {lv.concurrency}: {lv.failed} of {lv.requests} failed: {lv.errors[0]}"
            )
        tel = lv.telemetry
        if tel and tel.daemon_limit_max is not None and tel.daemon_limit_max < lv.concurrency:
            notes.append(
                f"level {lv.concurrency}: the daemon's concurrency limit was "
                f"{tel.daemon_limit_max}; the rest queued in the daemon"
            )
        if tel and tel.simulated:
            notes.append(f"level {lv.concurrency}: GPU telemetry is simulated")
    knee = find_knee(points, slo) if points else None
    caps = [
        lv.telemetry.daemon_limit_max
        for lv in levels
        if lv.telemetry is not None
        and lv.telemetry.daemon_limit_max is not None
        and lv.telemetry.daemon_limit_max < lv.concurrency
    ]
    capped = min(caps) if caps else None
    if capped is not None and knee is not None and knee.concurrency >= capped:
        notes.append(
            f"knee {knee.concurrency} not used as a ceiling: the daemon's limit {capped} capped "
            "the sweep there (raise it, e.g. manual mode with a high limit, and re-run)"
        )
    else:
        capped = None
    pareto = tuple(p.concurrency for p in pareto_front(points)) if points else ()
    scores = weighted_score(points, weights) if points else None
    return BenchReport(
        url=runner.target.url,
        model=runner.target.model,
        scenario=runner.settings.scenario,
        max_model_len=runner.target.max_model_len,
        settings=runner.settings,
        started_at_unix_s=started_unix,
        duration_s=time.perf_counter() - t0,
        levels=tuple(levels),
        knee=knee,
        pareto=pareto,
        scores=scores,
        slo=slo,
        tuning=tuning,
        notes=tuple(dict.fromkeys(notes)),
        capped_by_daemon_limit=capped,
    )


async def run_sweep(
    settings: BenchSettings,
    slo: Slo | None = None,
    weights: ScoreWeights | None = None,
    progress: ProgressFn | None = None,
) -> BenchReport:
    """Run every level of settings.concurrency (ascending) and analyse the sweep.

    Where throughput still rises at the largest level, the sweep doubles upward to
    settings.extend_to (analysis.next_extension). A level where every request fails ends
    the sweep (higher levels would fail too); the levels before it are still analysed.
    Raises BenchError when nothing at all succeeded.
    """
    started_unix, t0 = time.time(), time.perf_counter()
    async with BenchRunner(settings, progress) as runner:
        await runner.warmup()
        levels: list[LevelResult] = []
        planned = sorted(settings.concurrency)
        while planned:
            result = await runner.run_level(planned.pop(0))
            levels.append(result)
            if result.point is None:
                break
            if not planned:
                points = [lv.point for lv in levels if lv.point is not None]
                if (more := next_extension(points, settings.extend_to, slo)) is not None:
                    runner.expect_levels(len(levels) + 1)
                    planned.append(more)
        if not any(lv.point for lv in levels):
            raise BenchError(f"every request failed: {levels[-1].errors[0] if levels else '?'}")
        return _assemble(runner, levels, started_unix, t0, slo, weights, None)


async def run_tuning(
    settings: BenchSettings,
    slo: Slo | None = None,
    max_concurrency: int = 256,
    min_limit: int = 1,
    max_limit: int = 256,
    weights: ScoreWeights | None = None,
    progress: ProgressFn | None = None,
) -> BenchReport:
    """The three-phase tuning: baseline at 8, then up (or down) to the knee; report.tuning set.

    settings.concurrency is ignored: analysis.next_tuning_level picks each level.
    """
    started_unix, t0 = time.time(), time.perf_counter()
    async with BenchRunner(settings, progress) as runner:
        await runner.warmup()
        levels: list[LevelResult] = []
        points: list[SweepPoint] = []
        while (level := next_tuning_level(points, slo, max_concurrency)) is not None:
            runner.expect_levels(len(levels) + 1)
            result = await runner.run_level(level)
            levels.append(result)
            if result.point is None:
                break
            points.append(result.point)
        if not points:
            raise BenchError(f"every request failed: {levels[-1].errors[0] if levels else '?'}")
        levels.sort(key=lambda lv: lv.concurrency)
        tuning = tuning_result(points, slo, min_limit=min_limit, max_limit=max_limit)
        return _assemble(runner, levels, started_unix, t0, slo, weights, tuning)
