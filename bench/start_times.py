"""Engine start and graceful-restart times of the appliance with its shipped config.yaml.

What runs: `appliance serve` with the repo's config.yaml as shipped (the compiled path,
engine.enforce_eager false). Only state_dir (a fresh folder per variant), server.host/port and
engine.model (the converted default model, state/models/SmolLM2-135M-Instruct) are changed.
With --compare-eager the same phases run again with engine.enforce_eager true, for context.

Phases, per variant:
1. cold start: vLLM's compile cache (VLLM_CACHE_ROOT/torch_compile_cache, by default
   ~/.cache/vllm/torch_compile_cache) is removed first (compiled variant only; --keep-cache
   keeps it), then the daemon starts; timed from launch to GET /health/ready 200. The OS page
   cache is not dropped (that needs root), so the model files may be warm anyway.
2. warm-cache start: SIGTERM, then the same state_dir starts again; launch to ready. The
   compile cache directory (exists, size) is recorded after each start, and the daemon log's
   compile lines (AOT cache loaded, or "Compiling model again due to a load failure" and why).
   --quick skips this phase.
3. the weekly restart under load: with the daemon ready, --clients threads each send
   /v1/chat/completions (max_tokens --max-tokens) in a loop; after --lead-s the graceful
   restart is asked for with POST /admin/engine/restart (admin token from state_dir/admin.token),
   GET /admin/status is polled until the engine is "ready" on a new engine (started_at_s
   changed), and the load goes on --after-s more. Every request is counted: ok (200 with a
   choice) or failed (any other status, or a client error), by status code; the restart's
   duration (request to ready) and the longest request latency around it are reported. The
   target is zero failed requests. Clients never retry, so nothing is hidden.

Writes the raw numbers to docs/bench-start-times.json (rewritten after every phase, so a crash
keeps what ran) and a table into the section "start_times" of docs/benchmarks.md. Exits 1
when a phase errored or a request failed during the restart.

    .venv/bin/python bench/start_times.py [--compare-eager] [--keep-cache]
    .venv/bin/python bench/start_times.py --quick   # no warm start; JSON to state/, no docs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from appliance.client import AdminError, SyncAdminClient  # noqa: E402
from bench.report import (  # noqa: E402
    BENCHMARKS_MD,
    add_output_args,
    doc_parser,
    load_shipped,
    meta_head,
    publish,
    resolve_outputs,
    shipped_appliance_config,
    work_dir,
    write_json,
)
from bench.servers import ServerProc, free_port, start_appliance  # noqa: E402

JSON_OUT = ROOT / "docs" / "bench-start-times.json"
QUICK_JSON_OUT = ROOT / "state" / "bench-start-times-quick.json"
SECTION = "start_times"
START_TIMEOUT_S = 900.0  # a compiled start took ~130 s on 2 cores; leave room for a slow one
STOP_TIMEOUT_S = 180.0  # SIGTERM drains (engine.drain_timeout_s 60 shipped), then SIGKILL
RESTART_TIMEOUT_S = 900.0  # POST /admin/engine/restart to ready again
REQUEST_TIMEOUT_S = 600.0  # one chat request; queued ones wait out the restart
STATUS_POLL_S = 0.5
FAIL_PAUSE_S = 0.5  # a client pauses this long after a failure (no tight error loop)
PROMPT = "Name three colours of the rainbow."
# Daemon log lines worth keeping: what vLLM did with its compile cache and how long it took.
LOG_NEEDLES = (
    "Using cache directory",
    "Directly load AOT compilation",
    "Compiling model again due to a load failure",
    "saved AOT compiled function",
    "unable to save AOT compiled function",
    "torch.compile took",
    "Dynamo bytecode transform time",
    "finalize_loading",
    "engine started in",
)


# -- config, cache, logs -------------------------------------------------------------------


def _eager(eager: bool | None) -> dict[str, Any]:
    """engine.enforce_eager for the eager comparison; nothing for the shipped config."""
    return {} if eager is None else {"enforce_eager": eager}


def compile_cache_dir() -> Path:
    """Where vLLM keeps its torch.compile cache (VLLM_CACHE_ROOT/torch_compile_cache), by
    vLLM's own rule: $VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm, else ~/.cache/vllm."""
    default = os.getenv("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    root = Path(os.path.expanduser(os.getenv("VLLM_CACHE_ROOT", os.path.join(default, "vllm"))))
    return root / "torch_compile_cache"


def dir_stats(path: Path) -> dict[str, Any]:
    """Whether path exists, its size in bytes and how many files it holds."""
    out: dict[str, Any] = {"path": str(path), "exists": path.exists(), "bytes": 0, "files": 0}
    if not path.is_dir():
        return out
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                out["bytes"] += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
            out["files"] += 1
    out["mib"] = round(out["bytes"] / 2**20, 1)
    return out


def remove_cache(path: Path) -> dict[str, Any]:
    """Remove the compile cache; what was there."""
    before = dir_stats(path)
    if path.exists():
        shutil.rmtree(path)
    print(
        f"removed vLLM compile cache {path} ({before.get('mib', 0)} MiB, {before['files']} files)"
        if before["exists"]
        else f"vLLM compile cache {path} absent (nothing to remove)",
        flush=True,
    )
    return {"removed": before["exists"], "before": before, "after": dir_stats(path)}


def log_lines(path: Path, offset: int) -> list[str]:
    """Lines of the daemon log from byte offset on that contain one of LOG_NEEDLES."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    hits = [line.strip()[:600] for line in text.splitlines() if any(n in line for n in LOG_NEEDLES)]
    return hits[:40]


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def count_in_log(path: Path, needle: str) -> int:
    try:
        return path.read_text(errors="replace").count(needle)
    except OSError:
        return 0


# -- HTTP ------------------------------------------------------------------------------------


def http_json(
    method: str,
    url: str,
    body: dict[str, Any] | None = None,
    timeout_s: float = 10.0,
) -> tuple[int | None, Any, str | None]:
    """(status, parsed body or None, client error or None); never raises.

    The chat load's plain requests, from threads; admin calls go through appliance.client.
    """
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        try:
            raw = exc.read()
        except Exception:
            raw = b""
        status = exc.code
    except Exception as exc:
        return None, None, f"{type(exc).__name__}: {exc}"[:300]
    try:
        return status, json.loads(raw or b"null"), None
    except ValueError:
        return status, raw[:300].decode(errors="replace"), None


def last_event(status: Any, kind: str, after_seq: int = 0) -> dict[str, Any] | None:
    """The newest event of kind (with seq > after_seq) in a /admin/status snapshot."""
    if not isinstance(status, dict):
        return None
    found = [
        e
        for e in status.get("events") or []
        if e.get("kind") == kind and int(e.get("seq") or 0) > after_seq
    ]
    return found[-1] if found else None


def max_seq(status: Any) -> int:
    if not isinstance(status, dict):
        return 0
    return max((int(e.get("seq") or 0) for e in status.get("events") or []), default=0)


# -- phases ----------------------------------------------------------------------------------


def timed_start(cfg: dict[str, Any], state_dir: Path, start_timeout_s: float) -> dict[str, Any]:
    """Start the daemon; seconds from launch to /health/ready 200, and what it reported."""
    log = state_dir / "daemon.log"
    offset = log_size(log)  # start_appliance rewrites the log; 0 either way
    t0 = time.monotonic()
    server = start_appliance(cfg, state_dir, timeout_s=start_timeout_s)
    out: dict[str, Any] = {
        "server": server,
        "start_s": round(time.monotonic() - t0, 1),
        "url": server.url,
        "ready_history": server.ready_history,
    }
    try:
        status = SyncAdminClient.at(server.admin_address()).get("/admin/status")
    except AdminError as exc:  # recorded; the start itself counted
        status, out["status_error"] = None, exc.message
    ev = last_event(status, "engine_started")
    out["engine_start_s"] = (ev or {}).get("data", {}).get("seconds")
    out["log_offset"] = offset
    return out


def stop_daemon(server: ServerProc) -> dict[str, Any]:
    t0 = time.monotonic()
    code = server.stop(timeout_s=STOP_TIMEOUT_S)
    return {"exit_status": code, "stop_s": round(time.monotonic() - t0, 1)}


class ChatLoad:
    """`clients` threads, each sending one chat request after another until stopped."""

    def __init__(self, url: str, model: str, clients: int, max_tokens: int, hard_s: float):
        self.url = url + "/v1/chat/completions"
        self.body = {
            "model": model,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        self.clients = clients
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._hard_deadline = self._t0 + hard_s  # bound even if nobody calls stop()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"load-{i}", daemon=True)
            for i in range(clients)
        ]

    def now(self) -> float:
        """Seconds since the load was created (the time base of every record)."""
        return time.monotonic() - self._t0

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> bool:
        """Stop sending; wait for the requests in flight. True if every thread ended."""
        self._stop.set()
        deadline = time.monotonic() + REQUEST_TIMEOUT_S + 30
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.records)

    def _run(self, client: int) -> None:
        while not self._stop.is_set() and time.monotonic() < self._hard_deadline:
            start = self.now()
            code, body, err = http_json("POST", self.url, self.body, timeout_s=REQUEST_TIMEOUT_S)
            end = self.now()
            ok = code == 200 and isinstance(body, dict) and bool(body.get("choices"))
            rec: dict[str, Any] = {
                "client": client,
                "start_s": round(start, 3),
                "end_s": round(end, 3),
                "latency_s": round(end - start, 3),
                "status": code,
                "ok": ok,
            }
            if not ok:
                rec["error"] = err or json.dumps(body)[:300]
            with self._lock:
                self.records.append(rec)
            if not ok:
                self._stop.wait(FAIL_PAUSE_S)


def outcome_key(rec: dict[str, Any]) -> str:
    if rec["status"] is None:
        return "client_error:" + str(rec.get("error", "")).split(":", 1)[0]
    if rec["status"] == 200 and not rec["ok"]:
        return "200_without_choices"
    return str(rec["status"])


def summarize_load(records: list[dict[str, Any]], t_req: float, t_ready: float) -> dict[str, Any]:
    """Counts by outcome, overall and for the requests that overlapped the restart."""

    def counts(recs: list[dict[str, Any]]) -> dict[str, Any]:
        lat = sorted(r["latency_s"] for r in recs)
        return {
            "total": len(recs),
            "ok": sum(1 for r in recs if r["ok"]),
            "failed": sum(1 for r in recs if not r["ok"]),
            "by_status": dict(Counter(outcome_key(r) for r in recs)),
            "max_latency_s": lat[-1] if lat else None,
            "p50_latency_s": lat[len(lat) // 2] if lat else None,
        }

    during = [r for r in records if r["start_s"] <= t_ready and r["end_s"] >= t_req]
    failures = [r for r in records if not r["ok"]]
    return {
        "all": counts(records),
        "during_restart": counts(during),
        "before_restart": counts([r for r in records if r["end_s"] < t_req]),
        "after_restart": counts([r for r in records if r["start_s"] > t_ready]),
        "first_failures": failures[:10],
    }


def _status(admin: SyncAdminClient) -> dict[str, Any] | None:
    """GET /admin/status, or None when the daemon does not answer it (counted by the caller)."""
    try:
        return admin.get("/admin/status")
    except AdminError:
        return None


def _wait_ready_on_new_engine(
    server: ServerProc,
    admin: SyncAdminClient,
    load: ChatLoad,
    t_req: float,
    before: dict[str, Any],
    out: dict[str, Any],
) -> float | None:
    """Poll /admin/status until the engine is ready on a new engine; when, on the load's clock.

    The states seen, the poll errors and the events of the restart go into out.
    """
    started_before, seq0 = before["engine"].get("started_at_s"), max_seq(before)
    states: list[tuple[float, str]] = []
    out["states"], out["status_poll_errors"] = states, 0
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            out["error"] = f"daemon exited {server.proc.returncode} during the restart"
            return None
        snap = _status(admin)
        if snap is None:
            out["status_poll_errors"] += 1
            time.sleep(STATUS_POLL_S)
            continue
        eng = snap["engine"]
        state = str(eng.get("state"))
        if not states or states[-1][1] != state:
            states.append((round(load.now() - t_req, 2), state))
            print(f"    +{states[-1][0]:.1f} s engine {state}", flush=True)
        if state == "ready" and eng.get("started_at_s") != started_before:
            kinds = ("engine_restarted", "engine_started", "drain_timeout", "engine_start_failed")
            out["status_after"] = {
                "restarts_total": eng.get("restarts_total"),
                "last_error": eng.get("last_error"),
                **{kind: last_event(snap, kind, seq0) for kind in kinds},
            }
            return load.now()
        time.sleep(STATUS_POLL_S)
    out["error"] = f"not ready on a new engine within {RESTART_TIMEOUT_S:g} s"
    return None


def restart_under_load(server: ServerProc, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Chat load; POST /admin/engine/restart; poll until ready on a new engine; count."""
    admin = SyncAdminClient.at(server.admin_address(), timeout_s=30)
    out: dict[str, Any] = {
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "lead_s": args.lead_s,
        "after_s": args.after_s,
    }
    try:
        before = admin.get("/admin/status")
    except AdminError as exc:
        out["error"] = f"GET /admin/status before the restart: {exc.message}"
        return out
    out["state_before"] = before["engine"].get("state")

    hard_s = args.lead_s + RESTART_TIMEOUT_S + args.after_s + 60
    load = ChatLoad(server.url, model, args.clients, args.max_tokens, hard_s)
    load.start()
    t_req = t_ready = None
    try:
        time.sleep(args.lead_s)  # requests are running when the restart is asked for
        t_req = load.now()
        try:
            out["restart_request"] = {"body": admin.post("/admin/engine/restart", {})}
            print("    POST /admin/engine/restart accepted", flush=True)
        except AdminError as exc:
            out["restart_request"] = {"status": exc.status, "error": exc.message}
            out["error"] = f"POST /admin/engine/restart: {exc.message}"
        else:
            t_ready = _wait_ready_on_new_engine(server, admin, load, t_req, before, out)
        if t_ready is not None:
            out["restart_s"] = round(t_ready - t_req, 1)
            ev = (out["status_after"] or {}).get("engine_restarted")
            out["daemon_restart_s"] = (ev or {}).get("data", {}).get("seconds")
            time.sleep(args.after_s)  # load goes on after the restart
    finally:
        out["load_stopped_cleanly"] = load.stop()
        records = load.snapshot()
    end = t_ready if t_ready is not None else load.now()
    out["load"] = summarize_load(records, t_req if t_req is not None else 0.0, end)
    out["records"] = records
    return out


def _start_phase(
    res: dict[str, Any],
    phase: str,
    name: str,
    eager: bool | None,
    state_dir: Path,
    model_dir: Path,
    args: argparse.Namespace,
) -> ServerProc | None:
    """One timed start (cold or warm) into res["phases"][phase]; the server, or None."""
    print(f"  {name}: {phase}", flush=True)
    cfg = shipped_appliance_config(state_dir, free_port(), model_dir, **_eager(eager))
    try:
        st = timed_start(cfg, state_dir, args.start_timeout)
    except Exception as exc:
        res["phases"][phase] = {"error": f"start failed: {exc}"[-4000:]}
        print(f"  {name} {phase} failed: {exc}"[:2000], flush=True)
        return None
    server: ServerProc = st.pop("server")
    st["log"] = log_lines(state_dir / "daemon.log", st.pop("log_offset"))
    st["cache_after"] = dir_stats(compile_cache_dir())
    res["phases"][phase] = st
    print(
        f"  {name}: {phase} {st['start_s']:.1f} s (engine {st['engine_start_s']} s); "
        f"compile cache after: exists {st['cache_after']['exists']}, "
        f"{st['cache_after'].get('mib', 0)} MiB",
        flush=True,
    )
    return server


def run_variant(
    name: str,
    eager: bool | None,
    args: argparse.Namespace,
    work: Path,
    model_dir: Path,
    model_name: str,
    results: dict[str, Any],
    save: Callable[[], None],
) -> dict[str, Any]:
    """The phases for one engine setting, kept in results[name] and saved as each finishes."""
    res: dict[str, Any] = {"enforce_eager": eager, "phases": {}}
    results[name] = res
    phases = res["phases"]
    state_dir = work / f"appliance-{name}"
    log = state_dir / "daemon.log"
    cache = compile_cache_dir()
    server: ServerProc | None = None
    try:
        # 1. cold start
        if name == "compiled" and not args.keep_cache:
            res["cache_removed"] = remove_cache(cache)
        else:
            res["cache_removed"] = None
            why = "--keep-cache" if name == "compiled" else "eager does not compile"
            print(f"  compile cache left as it is ({why}): {dir_stats(cache)}", flush=True)
        res["cache_before_cold"] = dir_stats(cache)
        server = _start_phase(res, "cold_start", name, eager, state_dir, model_dir, args)
        if server is None:
            return res
        save()

        # 2. warm-cache start
        if not args.quick:
            phases["stop_after_cold"] = stop_daemon(server)
            print(f"  {name}: stopped ({phases['stop_after_cold']})", flush=True)
            server = _start_phase(res, "warm_start", name, eager, state_dir, model_dir, args)
            if server is None:
                return res
            save()

        # 3. graceful restart under load
        print(f"  {name}: restart under load ({args.clients} clients)", flush=True)
        offset = log_size(log)
        try:
            rs = restart_under_load(server, model_name, args)
        except Exception as exc:
            rs = {"error": f"restart phase failed: {exc!r}"[-4000:]}
        rs["log"] = log_lines(log, offset)
        rs["cache_after"] = dir_stats(cache)
        phases["restart_under_load"] = rs
        during = rs.get("load", {}).get("during_restart", {})
        print(
            f"  {name}: restart {rs.get('restart_s')} s; requests during it: "
            f"{during.get('ok')} ok, {during.get('failed')} failed {during.get('by_status')}, "
            f"longest {during.get('max_latency_s')} s",
            flush=True,
        )
        save()
    finally:
        if server is not None:
            res["final_stop"] = stop_daemon(server)
        res["maintenance_jobs_started"] = count_in_log(log, "job_started")
        save()
    return res


# -- report ----------------------------------------------------------------------------------


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def phase_value(run: dict[str, Any] | None, phase: str, key: str) -> Any:
    if not run:
        return None
    ph = run["phases"].get(phase) or {}
    if "error" in ph and key not in ph:
        return "error"
    return ph.get(key)


def load_value(run: dict[str, Any] | None, key: str) -> Any:
    if not run:
        return None
    rs = run["phases"].get("restart_under_load") or {}
    return (rs.get("load") or {}).get("during_restart", {}).get(key)


def failed_text(run: dict[str, Any] | None) -> str:
    if not run:
        return "n/a"
    rs = run["phases"].get("restart_under_load") or {}
    during = (rs.get("load") or {}).get("during_restart")
    if not during:
        return "error" if "error" in rs else "n/a"
    text = f"{during['failed']} of {during['total']}"
    bad = {k: v for k, v in during["by_status"].items() if k != "200"}
    if bad:
        text += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(bad.items())) + ")"
    return text


def cache_note(run: dict[str, Any]) -> list[str]:
    """What the compile cache and vLLM's log said, for the compiled variant."""
    lines = []
    removed = run.get("cache_removed")
    if removed is None:
        lines.append("- Compile cache: kept from before the run (`--keep-cache`).")
    else:
        b = removed["before"]
        lines.append(
            f"- Compile cache `{b['path']}`: removed before the cold start "
            f"({b.get('mib', 0)} MiB, {b['files']} files)."
            if removed["removed"]
            else f"- Compile cache `{b['path']}`: absent before the cold start."
        )
    for phase in ("cold_start", "warm_start", "restart_under_load"):
        ph = run["phases"].get(phase)
        if not ph or "cache_after" not in ph:
            continue
        c = ph["cache_after"]
        loaded = sum("Directly load AOT compilation" in x for x in ph.get("log", []))
        failed = [x for x in ph.get("log", []) if "Compiling model again" in x]
        text = (
            f"- After {phase.replace('_', ' ')}: cache exists {str(c['exists']).lower()}, "
            f"{c.get('mib', 0)} MiB / {c['files']} files; vLLM log: {loaded} AOT load(s)"
        )
        if failed:
            text += f", {len(failed)} load failure(s), e.g. `{failed[0][-200:]}`"
        lines.append(text + ".")
    return lines


def render(results: dict[str, Any], meta: dict[str, Any]) -> str:
    comp = results.get("compiled")
    eager = results.get("eager")
    cols = ["phase", "compiled (shipped)"] + (["eager"] if eager is not None else [])

    def row(label: str, get: Callable[[Any], Any]) -> tuple[str, Any, Any]:
        """One table row: label, the compiled variant's value, the eager one's."""
        return label, get(comp), get(eager)

    def phase_row(label: str, phase: str, key: str) -> tuple[str, Any, Any]:
        return row(label, lambda run: phase_value(run, phase, key))

    rows = [
        phase_row("cold start: launch to `/health/ready` 200, s", "cold_start", "start_s"),
        phase_row("(of it) engine start inside the daemon, s", "cold_start", "engine_start_s"),
    ]
    if not meta["quick"]:
        rows += [
            phase_row("warm-cache start: launch to ready, s", "warm_start", "start_s"),
            phase_row("(of it) engine start inside the daemon, s", "warm_start", "engine_start_s"),
        ]
    rows += [
        phase_row(
            "graceful restart under load: POST to ready, s", "restart_under_load", "restart_s"
        ),
        row("requests overlapping the restart: failed of total", failed_text),
        row(
            "longest request latency during the restart, s",
            lambda run: load_value(run, "max_latency_s"),
        ),
    ]
    eager_note = " (engine.enforce_eager true for the eager column)" if eager is not None else ""
    cold_note = (
        "Cold: vLLM's compile cache kept (`--keep-cache`)."
        if meta["keep_cache"]
        else "Cold: vLLM's compile cache removed first."
    )
    lines = [
        "## Engine start and graceful restart (shipped config)",
        "",
        f"Measured {meta['date']} with `{meta['command']}` on {meta['machine']}, vLLM "
        f"{meta['vllm']} CPU engine, model {meta['model']}. `config.yaml` as shipped; only "
        f"state_dir, server.host/port and engine.model changed{eager_note}. {cold_note} "
        "The OS page cache is not dropped. Warm: SIGTERM, then the same state_dir started "
        "again. Restart: "
        f"{meta['clients']} clients sending `/v1/chat/completions` (max_tokens "
        f"{meta['max_tokens']}) back to back from {meta['lead_s']:g} s before "
        f"`POST /admin/engine/restart` to {meta['after_s']:g} s after ready; clients never "
        "retry. Target: no failed request.",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for label, c, e in rows:
        cells = [label, c if isinstance(c, str) else fmt(c)]
        if eager is not None:
            cells.append(e if isinstance(e, str) else fmt(e))
        lines.append("| " + " | ".join(cells) + " |")
    if comp:
        lines += ["", *cache_note(comp)]
    jobs = {k: r.get("maintenance_jobs_started") for k, r in results.items() if r}
    if any(jobs.values()):
        lines.append(f"- Maintenance jobs started during the run (log `job_started`): {jobs}.")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = doc_parser(__doc__)
    parser.add_argument(
        "--keep-cache",
        action="store_true",
        help="do not remove vLLM's compile cache before the cold start",
    )
    parser.add_argument(
        "--compare-eager",
        action="store_true",
        help="run the phases again with engine.enforce_eager true, for context",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="skip the warm start (the restart runs on the cold-started daemon); writes the "
        f"JSON to {QUICK_JSON_OUT.relative_to(ROOT)} and docs/ only if --out/--json say so",
    )
    parser.add_argument("--clients", type=int, default=4, help="load threads (default 4)")
    parser.add_argument("--max-tokens", type=int, default=16, help="per request (default 16)")
    parser.add_argument(
        "--lead-s", type=float, default=5.0, help="load before the restart request (default 5)"
    )
    parser.add_argument(
        "--after-s", type=float, default=10.0, help="load after ready again (default 10)"
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=START_TIMEOUT_S,
        help=f"seconds a daemon start may take (default {START_TIMEOUT_S:g})",
    )
    add_output_args(parser, BENCHMARKS_MD, JSON_OUT, "daemon logs")
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= 64:
        parser.error("--clients must be between 1 and 64")
    if not 1 <= args.max_tokens <= 1024:
        parser.error("--max-tokens must be between 1 and 1024")
    for key in ("lead_s", "after_s"):
        if not 0 <= getattr(args, key) <= 600:
            parser.error(f"--{key.replace('_', '-')} must be between 0 and 600")
    if not 10 <= args.start_timeout <= 3600:
        parser.error("--start-timeout must be between 10 and 3600")
    resolve_outputs(args, BENCHMARKS_MD, JSON_OUT, QUICK_JSON_OUT)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    model_dir, shipped, model_name = load_shipped()
    command = "python bench/start_times.py" + "".join(
        f" --{flag}"
        for flag, on in (
            ("quick", args.quick),
            ("compare-eager", args.compare_eager),
            ("keep-cache", args.keep_cache),
        )
        if on
    )
    meta: dict[str, Any] = {
        **meta_head(command, model_name, model_dir),
        "shipped_enforce_eager": shipped.engine.enforce_eager,
        "shipped_drain_timeout_s": shipped.engine.drain_timeout_s,
        "shipped_max_queue_wait_s": shipped.admission.max_queue_wait_s,
        "appliance_config": "config.yaml as shipped; changed: state_dir, server.host, "
        "server.port, engine.model (eager variant: engine.enforce_eager true)",
        "compile_cache_dir": str(compile_cache_dir()),
        "quick": args.quick,
        "keep_cache": args.keep_cache,
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "lead_s": args.lead_s,
        "after_s": args.after_s,
        "start_timeout_s": args.start_timeout,
    }
    results: dict[str, Any] = {}

    def save(complete: bool = False) -> None:
        write_json(args.json, {"complete": complete, "meta": meta, "results": results})

    variants: list[tuple[str, bool | None]] = [("compiled", None)]
    if args.compare_eager:
        variants.append(("eager", True))
    with work_dir(args.work_dir, "bench-start-") as work:
        for name, eager in variants:
            print(f"{name} (enforce_eager {eager if eager is not None else 'as shipped'})")
            run_variant(name, eager, args, work, model_dir, model_name, results, save)
    save(complete=True)
    publish(render(results, meta), args.out, args.json, SECTION)
    broken = False
    for run in results.values():
        phases = run.get("phases", {})
        broken |= any("error" in ph for ph in phases.values() if isinstance(ph, dict))
        broken |= bool(load_value(run, "failed"))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
