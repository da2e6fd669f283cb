"""Goodput under overload: the batch controller vs unbounded admission vs the best static limit.

Open-loop load (Poisson, and bursty: an on/off modulated Poisson process) at multiples of the
box's capacity, streamed chat requests; goodput = requests that met the SLO (P99 targets
applied per request: TTFT <= --slo-ttft-s and TPOT <= --slo-tpot-s) per second of offered
load. Requests still running `--drain-s` after the arrival window are cancelled and count as
missed; so do 429s and errors.

Arms:
  controller  the daemon with the batch controller in `auto` mode (PUT /admin/controller)
  unbounded   admission out of the way: every request goes straight to the engine, which is
              plain vLLM behaviour (its own scheduler queue, no shedding)
  static      the best fixed limit from a closed-loop sweep (highest request rate whose P99s
              keep the SLO), with queue waits bounded below the TTFT SLO

Two ways to run:
  --url URL [--token-file F]   one running daemon; arms are switched with PUT /admin/controller.
                               Without that endpoint the arms that need it are skipped, with a note.
  --start                      start a fresh `appliance serve` (real CPU engine) per arm, configured
                               for that arm; the controller arm still needs PUT /admin/controller.

    .venv/bin/python bench/goodput.py --start [--rates 1.5,2,3] [--duration-s 45]
        [--markdown docs/benchmarks.md] [--json-out state/goodput.json]

Default run on the 2-core CPU box: ~3 daemon starts (1 min each), a sweep (~2 min) and
3 arms x 2 arrival kinds x 3 rates x ~(45 + drain) s: about 20-25 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from appliance.bench_runner import (  # noqa: E402
    BenchSettings,
    RequestSample,
    Target,
    chat_prompt,
    connect,
    run_sweep,
    stream_chat,
)
from appliance.client import (  # noqa: E402
    AdminClient,
    AdminError,
    DaemonAddress,
    find_daemon,
)
from appliance.domain.latency_window import percentile  # noqa: E402
from appliance.domain.sweep_analysis import Slo, SweepPoint  # noqa: E402
from bench.report import MODEL_DIR, write_section  # noqa: E402

ARMS = ("controller", "unbounded", "static")
ARRIVALS = ("poisson", "bursty")
UNBOUNDED_LIMIT = 4096


# -- arrivals (pure) -------------------------------------------------------------------------


def arrival_times(
    kind: str,
    rate_rps: float,
    duration_s: float,
    seed: int = 0,
    period_s: float = 10.0,
    burst_fraction: float = 0.25,
    quiet_ratio: float = 0.25,
) -> list[float]:
    """Arrival offsets in [0, duration_s) with mean rate rate_rps.

    poisson: exponential gaps. bursty: a square wave of `period_s`; the first
    `burst_fraction` of each period runs hot, the rest at `quiet_ratio` x the mean, the hot
    rate chosen so the mean stays rate_rps (drawn by thinning a Poisson process).
    """
    if kind not in ARRIVALS:
        raise ValueError(f"arrival: must be one of {', '.join(ARRIVALS)}, got {kind!r}")
    if not rate_rps > 0 or not duration_s > 0:
        raise ValueError(f"rate_rps and duration_s: must be > 0, got {rate_rps}, {duration_s}")
    if not 0 < burst_fraction < 1 or not 0 <= quiet_ratio < 1:
        raise ValueError("burst_fraction: must be in (0, 1); quiet_ratio: in [0, 1)")
    rng = random.Random(seed)
    if kind == "poisson":
        out, t = [], rng.expovariate(rate_rps)
        while t < duration_s:
            out.append(t)
            t += rng.expovariate(rate_rps)
        return out
    quiet = quiet_ratio * rate_rps
    hot = (rate_rps - (1 - burst_fraction) * quiet) / burst_fraction
    out, t = [], rng.expovariate(hot)
    while t < duration_s:
        in_burst = (t % period_s) < burst_fraction * period_s
        if rng.random() < (hot if in_burst else quiet) / hot:
            out.append(t)
        t += rng.expovariate(hot)
    return out


# -- one run -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GoodputSlo:
    """Per-request objectives a request must meet to count as good."""

    ttft_s: float
    tpot_s: float | None

    def good(self, s: RequestSample) -> bool:
        """The request succeeded within the TTFT and TPOT objectives."""
        return s.ok and s.ttft_s is not None and not self.late_ttft(s) and not self.late_tpot(s)

    def late_ttft(self, s: RequestSample) -> bool:
        """Its first token came past the TTFT objective."""
        return s.ttft_s is not None and s.ttft_s > self.ttft_s

    def late_tpot(self, s: RequestSample) -> bool:
        """Its tokens after the first came slower than the TPOT objective (where there is one)."""
        return self.tpot_s is not None and s.tpot_s is not None and s.tpot_s > self.tpot_s


@dataclass(frozen=True)
class RunResult:
    """One arm under one arrival pattern at one rate."""

    arm: str
    arrival: str
    rate_multiple: float
    rate_rps: float
    duration_s: float
    sent: int
    ok: int
    good: int
    rejected: int  # 429
    failed: int  # everything else that did not succeed, cancelled ones included
    goodput_rps: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    output_tok_s: float


def summarise_run(
    arm: str,
    arrival: str,
    multiple: float,
    rate_rps: float,
    duration_s: float,
    samples: Sequence[RequestSample],
    slo: GoodputSlo,
) -> RunResult:
    """Goodput and latency of one run's samples."""
    ok = [s for s in samples if s.ok]
    good = sum(slo.good(s) for s in samples)
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    tpot = [s.tpot_s for s in ok if s.tpot_s is not None]
    rejected = sum(s.status == 429 for s in samples)
    return RunResult(
        arm=arm,
        arrival=arrival,
        rate_multiple=multiple,
        rate_rps=rate_rps,
        duration_s=duration_s,
        sent=len(samples),
        ok=len(ok),
        good=good,
        rejected=rejected,
        failed=len(samples) - len(ok) - rejected,
        goodput_rps=good / duration_s,
        ttft_p50_s=percentile(ttft, 50) if ttft else None,
        ttft_p99_s=percentile(ttft, 99) if ttft else None,
        tpot_p99_s=percentile(tpot, 99) if tpot else None,
        output_tok_s=sum(s.completion_tokens for s in ok) / duration_s,
    )


def _cancelled(kind: str, started_s: float) -> RequestSample:
    elapsed_s = time.perf_counter() - started_s
    error = "cancelled after the drain time"
    return RequestSample(False, kind, 0, error, None, 0, None, None, elapsed_s, started_s)


def run_tag() -> str:
    """A tag put before every prompt of one run, new for each run. Arms replay the same
    seeded prompts on one daemon, and vLLM's prefix cache (on by default) keeps what one run
    served: the next run would find those prompts cached and skip their prefill, so whichever
    arm ran later was measured on a warmer cache. Prompts that differ from their first user
    token on share no cached block with another run's; what a run shares with itself (the
    chat template, its own repeats) it still finds."""
    return f"[run {uuid.uuid4().hex[:8]}] "


async def open_loop(
    session: aiohttp.ClientSession,
    target: Target,
    times: Sequence[float],
    max_tokens: int,
    drain_s: float,
    seed: int = 0,
) -> list[RequestSample]:
    """Fire one request at each offset (no waiting on earlier ones); collect every outcome.
    The run's prompts are its own (run_tag)."""
    tag = run_tag()
    t0 = time.perf_counter()
    tasks: list[asyncio.Task[RequestSample]] = []
    for i, offset in enumerate(times):
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(
            asyncio.create_task(
                stream_chat(
                    session, target, tag + chat_prompt(i, seed), max_tokens, seed=seed * 100_003 + i
                )
            )
        )
    end_of_window = t0 + (times[-1] if times else 0.0)
    return await settle(tasks, end_of_window + drain_s, t0)


async def settle(
    tasks: Sequence[asyncio.Task[RequestSample]], until_perf_s: float, t0: float
) -> list[RequestSample]:
    """Every request's outcome by `until_perf_s` (perf_counter); later ones are cancelled and
    count as missed."""
    remaining = max(0.0, until_perf_s - time.perf_counter())
    if tasks:
        await asyncio.wait(tasks, timeout=remaining)
    out = []
    for task in tasks:
        if task.done() and not task.cancelled():
            out.append(task.result())
        else:
            task.cancel()  # the client goes away; the daemon aborts the engine request
            out.append(_cancelled("chat", t0))
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(*tasks, return_exceptions=True)
    return out


# -- talking to the daemon --------------------------------------------------------------------


def _load_session() -> aiohttp.ClientSession:
    """The load's session: no total timeout (the drain bounds it), no connection cap."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))


class Daemon:
    """The admin calls goodput makes on one daemon: switch arms, wait for idle; never raises."""

    def __init__(self, admin: AdminClient) -> None:
        self.admin = admin

    async def status(self) -> dict[str, Any] | None:
        """GET /admin/status, or None without a token or on any error."""
        if self.admin.token.value is None:
            return None
        try:
            return await self.admin.status()
        except AdminError:
            return None

    @staticmethod
    def restore_body(status: dict[str, Any]) -> dict[str, Any]:
        """The PUT /admin/controller body that puts back the controller this status shows:
        its mode, bounds, and manual limit when it has one."""
        ctl = status.get("controller") or {}
        body: dict[str, Any] = {"mode": ctl.get("mode", "auto")}
        body.update({k: ctl[k] for k in ("min", "max") if isinstance(ctl.get(k), int)})
        if isinstance(ctl.get("manual_limit"), int):
            body["limit"] = ctl["manual_limit"]
        return body

    async def prefix_cache_tokens(self) -> tuple[int, int] | None:
        """The engine's prompt tokens looked up in its prefix cache and found there, since
        it started; None when status or the counters are not readable."""
        snap = await self.status()
        counters = ((snap or {}).get("engine") or {}).get("counters") or {}
        queried = counters.get("prefix_cache_queried_tokens_total")
        hit = counters.get("prefix_cache_hit_tokens_total")
        if not isinstance(queried, int) or not isinstance(hit, int):
            return None
        return queried, hit

    async def set_controller(self, body: dict[str, Any]) -> tuple[bool, str]:
        """PUT /admin/controller; (applied, what happened)."""
        try:
            await self.admin.put("/admin/controller", body)
        except AdminError as exc:
            return False, f"PUT /admin/controller failed: {exc.message}"
        return True, f"PUT /admin/controller {json.dumps(body)}: applied"

    async def wait_idle(self, timeout_s: float = 120.0) -> None:
        """Until nothing runs or waits (or a fixed pause when status is not readable)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            snap = await self.status()
            if snap is None:
                await asyncio.sleep(3.0)
                return
            adm = snap.get("admission") or {}
            queued = adm.get("queued") or {}
            if adm.get("in_flight", 0) == 0 and sum(queued.values()) == 0:
                return
            await asyncio.sleep(0.5)


def best_static(points: Sequence[SweepPoint], slo: GoodputSlo) -> tuple[SweepPoint, str]:
    """The level with the highest request rate whose P99s keep the SLO (else the lowest)."""
    keep = Slo(ttft_p99_s=slo.ttft_s, tpot_p99_s=slo.tpot_s)
    ok = [p for p in points if keep.meets(p)]
    if not ok:
        low = min(points, key=lambda p: p.concurrency)
        return low, f"no sweep level keeps the SLO; using the lowest, {low.concurrency}"
    best = max(ok, key=lambda p: (p.request_per_s, -p.concurrency))
    return best, (
        f"best static limit {best.concurrency}: {best.request_per_s:.2f} req/s with P99 TTFT "
        f"{best.ttft_p99_s:.2f} s inside the SLO"
    )


@dataclass
class Plan:
    """What to run: rates, arrival kinds, the SLO, and how long."""

    rates: tuple[float, ...]
    arrivals: tuple[str, ...]
    slo: GoodputSlo
    duration_s: float
    drain_s: float
    max_tokens: int
    sweep_levels: tuple[int, ...]
    seed: int = 0


async def run_arm(
    session: aiohttp.ClientSession,
    url: str,
    arm: str,
    plan: Plan,
    capacity_rps: float,
    daemon: Daemon | None = None,
    log: Any = print,
) -> list[RunResult]:
    """Every arrival kind x rate for one arm on one (already configured) endpoint."""
    target = await connect(session, BenchSettings(url=url))
    out = []
    for arrival in plan.arrivals:
        for multiple in plan.rates:
            rate = multiple * capacity_rps
            times = arrival_times(arrival, rate, plan.duration_s, seed=plan.seed)
            samples = await open_loop(
                session, target, times, plan.max_tokens, plan.drain_s, plan.seed
            )
            result = summarise_run(arm, arrival, multiple, rate, plan.duration_s, samples, plan.slo)
            log(
                f"  {arm:<10} {arrival:<7} x{multiple:<4g} {rate:6.2f} req/s: "
                f"goodput {result.goodput_rps:.2f} req/s ({result.good}/{result.sent} good, "
                f"{result.rejected} rejected, {result.failed} failed)"
            )
            out.append(result)
            if daemon is not None:
                await daemon.wait_idle()
    return out


async def capacity_sweep(url: str, plan: Plan, token: str | None) -> tuple[SweepPoint, str]:
    """Closed-loop sweep; the best static level (its request rate is the capacity)."""
    settings = BenchSettings(
        url=url,
        concurrency=plan.sweep_levels,
        max_tokens=plan.max_tokens,
        admin_token=token,
        requests_per_level=None,
        seed=plan.seed,
    )
    report = await run_sweep(settings)
    return best_static(report.points, plan.slo)


async def run_against_url(
    address: DaemonAddress, plan: Plan, controller_body: dict[str, Any], log: Any = print
) -> dict[str, Any]:
    """All arms on one running daemon, switched through PUT /admin/controller.

    The controller's own settings (mode, limit, bounds) are read first and put back at the end.
    """
    notes: list[str] = []
    results: list[RunResult] = []
    url, token = address.url, address.token.value
    async with _load_session() as session, AdminClient.at(address) as admin:
        daemon = Daemon(admin)
        snap = await daemon.status() or {}
        original_limit = (snap.get("admission") or {}).get("base_limit")
        ctl = snap.get("controller") or {}
        bounds = {k: ctl[k] for k in ("min", "max") if isinstance(ctl.get(k), int)}
        unbounded = {"mode": "manual", "limit": UNBOUNDED_LIMIT, "max": UNBOUNDED_LIMIT}
        # The sweep must see the engine, not the daemon's own cap.
        can_switch, msg = await daemon.set_controller(unbounded)
        notes.append(msg)
        if not can_switch:
            notes.append(
                "no PUT /admin/controller: arms cannot be switched on a running daemon; "
                f"the sweep runs against the daemon as configured (limit {original_limit}); "
                "run with --start for the unbounded and static arms"
            )
        try:
            static, why = await capacity_sweep(url, plan, token)
            notes.append(why)
            capacity = static.request_per_s
            bodies = {
                "controller": {"mode": "auto", **bounds, **controller_body},
                "unbounded": unbounded,
                "static": {"mode": "manual", "limit": static.concurrency},
            }
            arms_done = []
            for arm in ARMS:
                applied, msg = (
                    await daemon.set_controller(bodies[arm]) if can_switch else (False, "")
                )
                if not applied:
                    notes.append(f"{arm}: skipped ({msg or 'PUT /admin/controller not available'})")
                    continue
                notes.append(f"{arm}: {msg}")
                log(f"arm {arm}")
                await daemon.wait_idle()
                results += await run_arm(session, url, arm, plan, capacity, daemon, log)
                arms_done.append(arm)
            if not arms_done:
                # Still measure something: the daemon as it stands is a static arm.
                notes.append(
                    f"as-is: measured the daemon with its configured limit {original_limit} "
                    "as the static arm"
                )
                log("arm static (as configured)")
                results += await run_arm(session, url, "static", plan, capacity, daemon, log)
        finally:
            if can_switch:
                _, msg = await daemon.set_controller(Daemon.restore_body(snap))
                notes.append(f"restored the controller: {msg}")
    return _doc(plan, capacity, static, results, notes, mode="url")


def _daemon_config(arm: str, plan: Plan, static_limit: int, model_dir: Path) -> dict[str, Any]:
    # Bounded arms shed what cannot meet the TTFT SLO anyway: a request that waited longer
    # than that is lost already, and serving it would only steal engine time from the next.
    bounded_wait_s = max(0.1, plan.slo.ttft_s / 2)
    admission: dict[str, Any] = {
        "controller": {"concurrency_limit": static_limit, "max_queue_wait_s": bounded_wait_s},
        "static": {"concurrency_limit": static_limit, "max_queue_wait_s": bounded_wait_s},
        # null: engine.max_num_seqs, all the engine can run (a config limit above it is refused);
        # the rest wait unshed, as in vLLM's own queue.
        "unbounded": {
            "concurrency_limit": None,
            "max_queue_wait_s": 3600,
            "queue_capacity": {"realtime": 4096, "interactive": 4096, "batch": 4096},
        },
    }[arm]
    return {
        "engine": {
            "model": str(model_dir),
            "max_model_len": 2048,
            "max_num_seqs": 64,
            "kv_cache_space_gib": 1,
            # Every arm alike; the compiled default would add minutes to each arm's start.
            "enforce_eager": True,
            "drain_timeout_s": 30,
        },
        "admission": {"realtime_reserved_share": 0, "retry_after_s": 1, **admission},
        # Every arm starts manual (the configured default is auto, which would move the
        # static and unbounded limits too); the controller arm switches to auto itself.
        "controller": {"mode": "manual"},
        "logging": {"level": "warning"},
    }


async def run_with_start(
    plan: Plan,
    controller_body: dict[str, Any],
    extra_config: dict[str, Any],
    log: Any = print,
) -> dict[str, Any]:
    """Start a daemon per arm (real engine), sweep on the unbounded one, run every arm."""
    from appliance.model_prep import prepare_default_model
    from bench.servers import free_port, start_appliance

    model_dir = prepare_default_model(MODEL_DIR)
    notes: list[str] = []
    results: list[RunResult] = []
    static: SweepPoint | None = None
    capacity = 0.0
    with tempfile.TemporaryDirectory(prefix="goodput-") as tmp:
        for arm in ("unbounded", "static", "controller"):
            limit = static.concurrency if static else 8
            cfg = _daemon_config(arm, plan, limit, model_dir)
            cfg["server"] = {"host": "127.0.0.1", "port": free_port()}
            for key, value in extra_config.items():
                cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
            log(f"starting the daemon for the {arm} arm ...")
            server = start_appliance(cfg, Path(tmp) / arm)
            address = server.admin_address()
            token = address.token.value
            try:
                async with _load_session() as session, AdminClient.at(address) as admin:
                    daemon = Daemon(admin)
                    if arm == "unbounded":
                        log("closed-loop sweep for the capacity and the best static limit ...")
                        static, why = await capacity_sweep(server.url, plan, token)
                        capacity = static.request_per_s
                        notes.append(why)
                        await daemon.wait_idle()
                    if arm == "controller":
                        applied, msg = await daemon.set_controller(
                            {"mode": "auto", **controller_body}
                        )
                        if not applied:
                            notes.append(f"controller: skipped ({msg})")
                            continue
                        notes.append(f"controller: {msg}")
                    log(f"arm {arm}")
                    results += await run_arm(session, server.url, arm, plan, capacity, daemon, log)
            finally:
                server.stop()
    assert static is not None
    return _doc(plan, capacity, static, results, notes, mode="start")


def _doc(
    plan: Plan,
    capacity: float,
    static: SweepPoint,
    results: list[RunResult],
    notes: list[str],
    mode: str,
) -> dict[str, Any]:
    return {
        "mode": mode,
        "measured_at_unix_s": time.time(),
        "plan": {**asdict(plan), "slo": asdict(plan.slo)},
        "capacity_rps": capacity,
        "best_static": static.to_dict(),
        "runs": [asdict(r) for r in results],
        "ratios": ratios(results),
        "notes": notes,
    }


def ratios(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Per arrival kind and rate: each arm's goodput and controller/unbounded, /static."""
    by_key: dict[tuple[str, float], dict[str, float]] = {}
    for r in results:
        by_key.setdefault((r.arrival, r.rate_multiple), {})[r.arm] = r.goodput_rps
    out = []
    for (arrival, multiple), arms in sorted(by_key.items()):
        row: dict[str, Any] = {"arrival": arrival, "rate_multiple": multiple, **arms}
        ctl = arms.get("controller")
        for other in ("unbounded", "static"):
            base = arms.get(other)
            row[f"controller_vs_{other}"] = (
                (ctl / base if base else math.inf) if ctl is not None and base is not None else None
            )
        out.append(row)
    return out


def render_markdown(doc: dict[str, Any]) -> str:
    """The results table for docs/."""
    slo = doc["plan"]["slo"]
    lines = [
        "## Goodput under overload (issue 4)",
        "",
        f"Measured {time.strftime('%Y-%m-%d', time.localtime(doc['measured_at_unix_s']))} "
        f"({doc['mode']} mode): SLO TTFT <= {slo['ttft_s']:g} s"
        + (f", TPOT <= {slo['tpot_s']:g} s" if slo["tpot_s"] else "")
        + f" per request; {doc['plan']['max_tokens']} output tokens; "
        f"{doc['plan']['duration_s']:g} s per run; capacity {doc['capacity_rps']:.2f} req/s "
        f"(best static limit {doc['best_static']['concurrency']}). Goodput in requests/s "
        "meeting the SLO. Targets: controller >= 1.5x unbounded, >= 0.95x best static.",
        "",
        "| arrival | load | controller | unbounded | static | ctl/unbounded | ctl/static |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(v: float | None) -> str:
        return "-" if v is None else ("inf" if math.isinf(v) else f"{v:.2f}")

    for row in doc["ratios"]:
        lines.append(
            f"| {row['arrival']} | {row['rate_multiple']:g}x | {cell(row.get('controller'))} | "
            f"{cell(row.get('unbounded'))} | {cell(row.get('static'))} | "
            f"{cell(row.get('controller_vs_unbounded'))} | "
            f"{cell(row.get('controller_vs_static'))} |"
        )
    lines += ["", *[f"- {n}" for n in doc["notes"]]]
    return "\n".join(lines) + "\n"


def _floats(text: str, name: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"{name}: {text!r} is not a comma-separated list of numbers") from None
    if not values or any(v <= 0 for v in values):
        raise SystemExit(f"{name}: need one or more values > 0, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the arms, print and write the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running daemon")
    where.add_argument("--start", action="store_true", help="start a daemon per arm")
    p.add_argument("--token-file", help="admin token of the --url daemon (default: its config)")
    p.add_argument("--config", help="the --url daemon's config, for its admin token")
    p.add_argument("--rates", default="1.5,2,3", help="load as multiples of capacity")
    p.add_argument("--arrivals", default="poisson,bursty")
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--slo-tpot-s", type=float, default=0.25, help="0 turns the TPOT check off")
    p.add_argument("--duration-s", type=float, default=45.0)
    p.add_argument("--drain-s", type=float, default=30.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--sweep", default="1,2,4,8,16,32", help="levels for the capacity sweep")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--controller-body", default="{}", help="extra JSON for PUT /admin/controller")
    p.add_argument("--config-json", default="{}", help="extra daemon config for --start (JSON)")
    p.add_argument("--markdown", help="write the table to this file")
    p.add_argument("--json-out", help="write every number to this file")
    args = p.parse_args(argv)

    arrivals = tuple(a.strip() for a in args.arrivals.split(",") if a.strip())
    bad = [a for a in arrivals if a not in ARRIVALS]
    if bad or not arrivals:
        raise SystemExit(f"arrivals: must be from {', '.join(ARRIVALS)}, got {args.arrivals!r}")
    if not args.slo_ttft_s > 0:
        raise SystemExit(f"slo-ttft-s: must be > 0, got {args.slo_ttft_s}")
    if not args.duration_s > 0 or args.drain_s < 0 or args.max_tokens < 1:
        raise SystemExit("duration-s must be > 0, drain-s >= 0, max-tokens >= 1")
    plan = Plan(
        rates=_floats(args.rates, "rates"),
        arrivals=arrivals,
        slo=GoodputSlo(args.slo_ttft_s, args.slo_tpot_s or None),
        duration_s=args.duration_s,
        drain_s=args.drain_s,
        max_tokens=args.max_tokens,
        sweep_levels=tuple(int(x) for x in _floats(args.sweep, "sweep")),
        seed=args.seed,
    )
    controller_body = json.loads(args.controller_body)
    if args.url:
        address = find_daemon(args.config, args.url, args.token_file)
        doc = asyncio.run(run_against_url(address, plan, controller_body))
    else:
        doc = asyncio.run(run_with_start(plan, controller_body, json.loads(args.config_json)))
    text = render_markdown(doc)
    print(text)
    if args.markdown:
        # docs/benchmarks.md holds other benchmarks' sections too: replace only this one.
        write_section(Path(args.markdown), "goodput", text)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
