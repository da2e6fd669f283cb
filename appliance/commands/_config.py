"""The config as the commands load it: the config model's checks and vLLM's own, together."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from appliance.config import Config, find_config_path, load_config
from appliance.errors import ConfigError

# A bad config makes every command exit 2, with a message naming each bad key.
CONFIG_ERROR_EXIT = 2


def load_for(args: argparse.Namespace) -> Config:
    """The config --config (or the search order) names, with --host/--port applied."""
    cfg = load_checked(find_config_path(getattr(args, "config", None)))
    return cfg.with_overrides(host=getattr(args, "host", None), port=getattr(args, "port", None))


def load_checked(path: str | Path | None) -> Config:
    """The config, with engine.vllm checked by vLLM's own parser too: one ConfigError that
    names every bad key, the config model's and the mapping's together."""
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        raise ConfigError(exc.source, exc.problems + _raw_mapping_problems(path)) from None
    _check_vllm_mapping(cfg.engine.vllm, str(path or "<defaults>"))
    return cfg


def _raw_mapping_problems(path: str | Path | None) -> list[tuple[str, str]]:
    """engine.vllm's problems straight from the file, when the rest of it did not parse."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))  # type: ignore[arg-type]
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
