"""`appliance keys add|list|revoke`: API keys, written to the state store's file directly.

The daemon need not run; when it does, it sees a change within a second (it polls the store).
A secret is printed once, by `add`; everything else shows its prefix only.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from appliance.commands._config import load_for
from appliance.commands._subparsers import add_command, add_group
from appliance.domain.api_keys import InvalidKeySpec, KeySpec
from appliance.domain.lanes import LANE_NAMES, Lane
from appliance.services.key_store import KeyExists, KeyInfo, KeyStore

USAGE_EXIT = 2  # argparse's own status for a bad argument

# KeySpec's fields as the command line names them, so a bad value names the flag.
_FLAGS = {
    "name": "NAME",
    "max_lane": "--lanes",
    "requests_per_min": "--rpm",
    "tokens_per_min": "--tpm",
    "concurrency_share": "--share",
    "weight": "--weight",
}


def register(sub: Any) -> None:
    """Add `keys add NAME ...`, `keys list [--json] [--all]`, `keys revoke NAME` and
    `keys purge`."""
    keys_sub = add_group(sub, "keys", "API keys: lanes, per-minute limits, share")
    p = add_command(
        keys_sub, "add", run_add, _add_config, help="make a key; its secret is printed once"
    )
    p.add_argument("name", help="a-z 0-9 _ . - (up to 64), starting with a letter or digit")
    p.add_argument(
        "--lanes",
        required=True,
        choices=LANE_NAMES,
        help="the ceiling: realtime allows all three lanes, batch only batch",
    )
    p.add_argument(
        "--downgrade", action="store_true", help="serve a lane above the ceiling at the ceiling"
    )
    p.add_argument("--rpm", type=int, help="requests per minute (none: no limit)")
    p.add_argument("--tpm", type=int, help="tokens per minute (none: no limit)")
    p.add_argument("--share", type=float, help="share of the concurrency limit, in (0, 1]")
    p.add_argument("--weight", type=int, default=1, help="fairness weight in a lane (1-100)")
    p = add_command(
        keys_sub, "list", run_list, _add_config, help="the keys (prefix only, never the secret)"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--all", action="store_true", help="revoked keys too")
    p = add_command(
        keys_sub, "revoke", run_revoke, _add_config, help="revoke a key (refused within a second)"
    )
    p.add_argument("name")
    add_command(
        keys_sub,
        "purge",
        run_purge,
        _add_config,
        help="forget revoked keys; with none active left, /v1 is open again",
    )


def _add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="config file (default: the search order)")


def _store(args: argparse.Namespace) -> KeyStore:
    """The key store in the state directory the config names (the daemon's own file)."""
    return KeyStore(load_for(args).state_dir / "appliance.db")


def _fail(message: str, status: int = USAGE_EXIT) -> int:
    print(f"appliance keys: {message}", file=sys.stderr)
    return status


def run_add(args: argparse.Namespace) -> int:
    """Store a new key and print its secret, once."""
    try:
        spec = KeySpec(
            name=args.name,
            max_lane=Lane.parse(args.lanes),
            downgrade=args.downgrade,
            requests_per_min=args.rpm,
            tokens_per_min=args.tpm,
            concurrency_share=args.share,
            weight=args.weight,
        )
    except InvalidKeySpec as exc:
        return _fail(f"{_FLAGS.get(exc.field, exc.field)}: {exc.message}")
    store = _store(args)
    try:
        secret = store.add(spec)
    except KeyExists as exc:
        return _fail(exc.message, status=1)
    finally:
        store.close()
    print(secret)
    print(
        f"key {spec.name!r} added ({_describe(spec)}). The secret above is shown only now "
        "and will not be shown again: keep it.",
        file=sys.stderr,
    )
    return 0


def run_list(args: argparse.Namespace) -> int:
    """Print the keys: name, prefix, lanes, limits, created, revoked."""
    store = _store(args)
    try:
        infos = store.list(include_revoked=args.all)
    finally:
        store.close()
    if args.json:
        print(json.dumps([_as_dict(i) for i in infos], indent=2))
        return 0
    if not infos:
        print("no keys: /v1 is open to anyone who can reach the port (see README, Sharing the box)")
        return 0
    header = ("name", "key", "lanes", "rpm", "tpm", "share", "weight", "created", "revoked")
    rows = [header, *(_row(i) for i in infos)]
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    """Revoke the active key NAME."""
    store = _store(args)
    try:
        done = store.revoke(args.name)
    finally:
        store.close()
    if not done:
        return _fail(f"no active key named {args.name!r} (see `appliance keys list`)", status=1)
    print(f"key {args.name!r} revoked; a running daemon refuses it within a second")
    return 0


def run_purge(args: argparse.Namespace) -> int:
    """Forget the revoked keys; say when that leaves /v1 open to everyone."""
    store = _store(args)
    try:
        forgotten = store.purge_revoked()
        open_now = not store.ever_had_keys()
    finally:
        store.close()
    print(f"{forgotten} revoked key(s) forgotten")
    if open_now:
        print(
            "no keys left: /v1 is open to anyone who reaches the port (as before any key); "
            "a running daemon opens within a second"
        )
    return 0


def _when(ts_s: float | None) -> str:
    if ts_s is None:
        return "-"
    return datetime.fromtimestamp(ts_s, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _lanes(spec: KeySpec) -> str:
    text = ",".join(lane.label for lane in spec.lanes)
    return text + " (downgrade)" if spec.downgrade else text


def _describe(spec: KeySpec) -> str:
    limits = [f"lanes {_lanes(spec)}"]
    if spec.requests_per_min is not None:
        limits.append(f"{spec.requests_per_min} requests/min")
    if spec.tokens_per_min is not None:
        limits.append(f"{spec.tokens_per_min} tokens/min")
    if spec.concurrency_share is not None:
        limits.append(f"{spec.concurrency_share:g} of the concurrency limit")
    return ", ".join(limits)


def _row(info: KeyInfo) -> tuple[str, ...]:
    s = info.spec
    return (
        s.name,
        info.prefix + "…",
        _lanes(s),
        "-" if s.requests_per_min is None else str(s.requests_per_min),
        "-" if s.tokens_per_min is None else str(s.tokens_per_min),
        "-" if s.concurrency_share is None else f"{s.concurrency_share:g}",
        str(s.weight),
        _when(info.created_s),
        _when(info.revoked_s),
    )


def _as_dict(info: KeyInfo) -> dict[str, Any]:
    return {
        **info.spec.as_dict(),
        "prefix": info.prefix,
        "created_s": info.created_s,
        "revoked_s": info.revoked_s,
    }
