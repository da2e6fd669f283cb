"""The `appliance` command."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from appliance.config import find_config_path, load_config, resolve_model_dir
from appliance.errors import ConfigError, EngineStartError

CONFIG_ERROR_EXIT = 2  # CONTRACT.md: a bad config exits 2

# Sub-commands that live in their own modules, each with register(sub).
_COMMAND_MODULES = (
    "appliance.commands.estimate",
    "appliance.commands.precheck",
    "appliance.commands.bench",
    "appliance.commands.install_service",
    "appliance.commands.logs",
    "appliance.commands.tui",
)


def _load(args: argparse.Namespace) -> Any:
    path = find_config_path(getattr(args, "config", None))
    cfg = _load_checked(path)
    return cfg.with_overrides(host=getattr(args, "host", None), port=getattr(args, "port", None))


def _load_checked(path: Any) -> Any:
    """The config, with engine.vllm checked by vLLM's own parser too: one ConfigError that
    names every bad key, the config model's and the mapping's together."""
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        raise ConfigError(exc.source, exc.problems + _raw_mapping_problems(path)) from None
    _check_vllm_mapping(cfg.engine.vllm, str(path or "<defaults>"))
    return cfg


def _raw_mapping_problems(path: Any) -> list[tuple[str, str]]:
    """engine.vllm's problems straight from the file, when the rest of it did not parse."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        mapping = data["engine"]["vllm"]
    except Exception:  # unreadable, not YAML, or no mapping: the config's errors say it
        return []
    if not isinstance(mapping, dict):
        return []
    try:
        _check_vllm_mapping(mapping, str(path))
    except ConfigError as exc:
        return exc.problems
    return []


def _check_vllm_mapping(mapping: dict[str, Any], source: str) -> None:
    """engine.vllm against vLLM's own parser: ConfigError names each engine.vllm.<key>.
    An empty mapping imports nothing; without vLLM the check is skipped with a warning."""
    if not mapping:
        return
    try:
        from appliance.adapters.vllm_args import check_vllm_mapping

        problems = check_vllm_mapping(mapping)
    except ImportError as exc:
        print(f"warning: engine.vllm not checked, vLLM does not import: {exc}", file=sys.stderr)
        return
    if problems:
        raise ConfigError(
            source, [(f"engine.vllm.{k}" if k else "engine.vllm", m) for k, m in problems]
        )


def cmd_serve(args: argparse.Namespace) -> int:
    from appliance.logs import setup_logging
    from appliance.serve import BadModelConfig, run_daemon

    cfg = _load(args)
    setup_logging(cfg.logging.level, cfg.logging.json_lines)
    try:
        return asyncio.run(run_daemon(cfg))
    except EngineStartError as exc:
        print(f"cannot start: {exc}", file=sys.stderr)
        # A bad engine.model or model config.json is a bad config (exit 2, as ConfigError).
        return CONFIG_ERROR_EXIT if isinstance(exc, BadModelConfig) else 1


def cmd_config_check(args: argparse.Namespace) -> int:
    cfg = _load_checked(args.path)
    print(f"{args.path}: OK (model {resolve_model_dir(cfg)}, port {cfg.server.port})")
    return 0


def cmd_model_prepare(args: argparse.Namespace) -> int:
    from appliance.model_prep import prepare_default_model

    cfg = _load(args)
    target = resolve_model_dir(cfg) if cfg.engine.model == "default" else None
    if target is None:
        print(f"engine.model is {cfg.engine.model}: nothing to prepare")
        return 0
    prepare_default_model(target, force=args.force)
    print(target)
    return 0


def _admin_token(args: argparse.Namespace, cfg: Any) -> str:
    if getattr(args, "token_file", None):
        return Path(args.token_file).read_text().strip()
    env = os.environ.get("APPLIANCE_ADMIN_TOKEN")
    if env:
        return env.strip()
    path = cfg.state_dir / cfg.server.admin_token_file
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise SystemExit(
            f"admin token: cannot read {path} ({exc.strerror}); "
            "set $APPLIANCE_ADMIN_TOKEN or pass --token-file"
        ) from None


def admin_get(url: str, token: str, path: str) -> Any:
    """GET an admin endpoint and decode its JSON (urllib: no event loop needed)."""
    req = urllib.request.Request(
        url.rstrip("/") + path, headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def admin_post(url: str, token: str, path: str) -> Any:
    """POST to an admin endpoint (no body) and decode its JSON."""
    req = urllib.request.Request(
        url.rstrip("/") + path,
        data=b"",
        method="POST",
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _daemon_call(args: argparse.Namespace, fn: Any) -> int:
    cfg = _load(args)
    url = args.url or f"http://{cfg.server.host}:{cfg.server.port}"
    try:
        return int(fn(url, _admin_token(args, cfg)))
    except urllib.error.HTTPError as exc:
        print(f"{url}: HTTP {exc.code}: {exc.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"{url}: daemon not reachable ({exc})", file=sys.stderr)
        return 1


def cmd_jobs_list(args: argparse.Namespace) -> int:
    def run(url: str, token: str) -> int:
        jobs = admin_get(url, token, "/admin/jobs")["jobs"]
        if args.json:
            print(json.dumps(jobs, indent=2))
            return 0
        print(f"{'job':<12} {'cron':<20} {'next run':<27} last")
        for j in jobs:
            last = j["history"][0] if j["history"] else None
            last_txt = f"{last['outcome']} ({last['trigger']})" if last else "never"
            print(f"{j['name']:<12} {j['cron']:<20} {j['next_run'] or '-':<27} {last_txt}")
        return 0

    return _daemon_call(args, run)


def cmd_jobs_run(args: argparse.Namespace) -> int:
    def run(url: str, token: str) -> int:
        suffix = "?force=1" if args.force else ""
        out = admin_post(url, token, f"/admin/jobs/{args.name}/run{suffix}")
        print(
            f"{out['job']}: {out['status']} ({out['trigger']}); follow it with "
            "`appliance jobs list` or the TUI"
        )
        return 0

    return _daemon_call(args, run)


def cmd_thresholds_list(args: argparse.Namespace) -> int:
    def run(url: str, token: str) -> int:
        doc = admin_get(url, token, "/admin/thresholds")
        if args.json:
            print(json.dumps(doc, indent=2))
            return 0
        active = doc["active"]
        print(f"in force (from {active['source']}, set {active['id'] or '-'}):")
        for key, value in active["data"].items():
            print(f"  {key:<22} {value}")
        earlier = ", ".join(str(t["id"]) for t in doc["previous"]) or "none"
        print(f"earlier sets (rollback targets, newest first): {earlier}")
        print(f"alert rules: {doc['rules_path']}")
        return 0

    return _daemon_call(args, run)


def cmd_thresholds_rollback(args: argparse.Namespace) -> int:
    def run(url: str, token: str) -> int:
        out = admin_post(url, token, "/admin/thresholds/rollback")
        print(json.dumps(out, indent=2))
        return 0

    return _daemon_call(args, run)


def cmd_status(args: argparse.Namespace) -> int:
    cfg = _load(args)
    url = args.url or f"http://{cfg.server.host}:{cfg.server.port}"
    try:
        snap = admin_get(url, _admin_token(args, cfg), "/admin/status")
    except urllib.error.HTTPError as exc:
        print(f"{url}: HTTP {exc.code}: {exc.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"{url}: daemon not reachable ({exc})", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(snap, indent=2))
        return 0
    eng, adm = snap["engine"], snap["admission"]
    stats = eng.get("stats") or {}
    print(f"engine     {eng['state']}  model {eng['model']}  device {eng.get('device', '?')}")
    print(
        f"kv cache   {eng.get('kv_cache_tokens')} tokens, "
        f"usage {stats.get('kv_cache_usage_ratio', 0):.1%}"
    )
    print(f"admission  limit {adm['limit']}  in flight {adm['in_flight']}  queued {adm['queued']}")
    print(f"restarts   {eng.get('restarts_total')}  uptime {snap['uptime_s']:.0f} s")
    ctl = snap.get("controller") or {}
    print(
        f"controller {ctl.get('mode')}  limit {adm['base_limit']} in [{ctl.get('min')}, "
        f"{ctl.get('max')}]  SLO p99 TTFT {ctl.get('slo_ttft_p99_s')} s, "
        f"TPOT {ctl.get('slo_tpot_p99_s')} s"
    )
    tel = snap.get("telemetry") or {}
    thermal = tel.get("thermal") or {}
    badge = "  SIMULATED" if tel.get("simulated") else ""
    print(
        f"thermal    {thermal.get('level')}  derate x{thermal.get('factor', 1):.2f}  "
        f"source {tel.get('source')}{badge}"
    )
    for g in tel.get("gpus") or []:
        if g.get("lost"):
            print(f"gpu{g['index']}       LOST ({g.get('uuid')})")
            continue
        print(
            f"gpu{g['index']}       {g.get('name')}  core {g.get('core_temp_c')} C  "
            f"HBM {g.get('mem_temp_c')} C  power {g.get('power_w')} W  "
            f"util {g.get('gpu_util_pct')} %"
        )
    per_token = (tel.get("energy_per_token_j") or {}).get("recent")
    if per_token is not None:
        print(f"energy     {per_token:.3g} J per generated token (last minute)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the daemon in the foreground")
    p.add_argument("--config")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("status", help="one-shot snapshot from the running daemon")
    p.add_argument("--config")
    p.add_argument("--url")
    p.add_argument("--token-file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    cfg_p = sub.add_parser("config", help="config file tools")
    cfg_sub = cfg_p.add_subparsers(dest="config_command", required=True)
    p = cfg_sub.add_parser("check", help="validate a config file; exit 2 naming every bad key")
    p.add_argument("path")
    p.set_defaults(func=cmd_config_check)

    jobs_p = sub.add_parser("jobs", help="maintenance jobs (through the running daemon)")
    jobs_sub = jobs_p.add_subparsers(dest="jobs_command", required=True)
    for name, fn, hlp in (
        ("list", cmd_jobs_list, "jobs, next run, last outcome"),
        ("run", cmd_jobs_run, "run a job now"),
    ):
        p = jobs_sub.add_parser(name, help=hlp)
        if name == "run":
            p.add_argument("name", help="restart | benchmark | recalibrate | predictor")
            p.add_argument("--force", action="store_true", help="skip the load guard")
        else:
            p.add_argument("--json", action="store_true")
        p.add_argument("--config")
        p.add_argument("--url")
        p.add_argument("--token-file")
        p.set_defaults(func=fn)

    th_p = sub.add_parser("thresholds", help="recalibrated alert and derating thresholds")
    th_sub = th_p.add_subparsers(dest="thresholds_command", required=True)
    for name, fn, hlp in (
        ("list", cmd_thresholds_list, "the set in force and the earlier ones"),
        ("rollback", cmd_thresholds_rollback, "go back to the set before the one in force"),
    ):
        p = th_sub.add_parser(name, help=hlp)
        if name == "list":
            p.add_argument("--json", action="store_true")
        p.add_argument("--config")
        p.add_argument("--url")
        p.add_argument("--token-file")
        p.set_defaults(func=fn)

    model_p = sub.add_parser("model", help="model tools")
    model_sub = model_p.add_subparsers(dest="model_command", required=True)
    p = model_sub.add_parser("prepare", help="convert the default model once (idempotent)")
    p.add_argument("--config")
    p.add_argument("--force", action="store_true")
    p.set_defaults(func=cmd_model_prepare)

    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return CONFIG_ERROR_EXIT


if __name__ == "__main__":
    sys.exit(main())
