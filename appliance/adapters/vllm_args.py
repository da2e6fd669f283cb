"""vLLM's own argument namespace for the engine and its OpenAI frontend.

The appliance's typed engine.* keys and the free engine.vllm mapping (any `vllm serve` flag,
with underscores or dashes) become one argv, turned from the mapping the way
`vllm serve --config FILE.yaml` turns a YAML file into flags (FlexibleArgumentParser's
load_config_file), and parsed by vLLM's own parser (make_arg_parser). The result is the
complete Namespace `vllm serve` would have: AsyncEngineArgs come from it, and so does vLLM's
serving layer (init_app_state).

vLLM is imported inside the functions only: importing it takes seconds.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from vllm import AsyncEngineArgs

    from appliance.config import Config

UNKNOWN = "unknown vLLM engine argument"

# vLLM's argument (its dest) -> the appliance key that sets it. One place per setting: these
# are refused in engine.vllm.
OWNED: dict[str, str] = {
    "model": "engine.model",
    "model_tag": "engine.model",
    "served_model_name": "engine.served_model_name",
    "max_model_len": "engine.max_model_len",
    "max_num_seqs": "engine.max_num_seqs",
    "max_num_batched_tokens": "engine.max_num_batched_tokens",
    "dtype": "engine.dtype",
    "kv_cache_dtype": "engine.kv_cache_dtype",
    "gpu_memory_utilization": "engine.gpu_memory_utilization",
    "tensor_parallel_size": "engine.tensor_parallel_size",
    "enforce_eager": "engine.enforce_eager",
    "scheduling_policy": "engine.scheduling_policy",
    "kv_cache_memory_bytes": "engine.kv_cache_space_gib",
    "seed": "engine.seed",
    # The appliance's own HTTP server listens and authenticates; vLLM's would not.
    "host": "server.host",
    "port": "server.port",
    "api_key": "server.api_keys",
}

# Placeholder model for checks: nothing is loaded.
_CHECK_MODEL = "/nonexistent/appliance-config-check"


class VllmArgsError(ValueError):
    """engine.vllm (or an engine.* value) that vLLM's parser refuses, as (key, problem)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__(
            "; ".join(f"engine.vllm.{k}: {m}" if k else f"engine.vllm: {m}" for k, m in problems)
        )


class _ParseError(Exception):
    """What vLLM's parser would print before exiting 2."""


def _parser() -> Any:
    """A fresh vLLM serve parser that raises instead of exiting.

    Fresh on purpose: parser defaults are objects (e.g. structured_outputs_config) that an
    engine start mutates, so a parser shared by two starts would leak one into the other.
    """
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class _RaisingParser(FlexibleArgumentParser):
        def error(self, message: str) -> Any:  # argparse would print usage and exit 2
            raise _ParseError(message)

        def exit(self, status: int = 0, message: str | None = None) -> Any:
            raise _ParseError(message or f"vLLM's parser exited ({status})")

    return make_arg_parser(_RaisingParser(prog="vllm serve"))


def _dashed(key: str) -> str:
    """vLLM's flag spelling: dashes up to the first '.' (a dotted key sets one field)."""
    head, dot, rest = str(key).partition(".")
    return head.replace("_", "-") + dot + rest


def _flag_value(value: Any) -> Any:
    """A value as `vllm serve --config` expects it: JSON for mappings and list items that are
    mappings or lists (argparse sees strings); None is dropped by the caller."""
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return [json.dumps(v) if isinstance(v, dict | list | tuple) else v for v in value]
    return value


def _to_argv(parser: Any, mapping: dict[str, Any]) -> list[str]:
    """Flags for mapping, made by vLLM's own YAML-config conversion (load_config_file):
    true -> --flag, false -> --no-flag (or nothing where the flag has no negation),
    a list -> the flag and each item, anything else -> the flag and its value."""
    data = {_dashed(k): _flag_value(v) for k, v in mapping.items() if v is not None}
    if not data:
        return []
    fd, name = tempfile.mkstemp(prefix="appliance-vllm-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yaml.safe_dump(data, f, sort_keys=False)
        return list(parser.load_config_file(name))
    finally:
        os.unlink(name)


def _action(parser: Any, key: str) -> Any:
    """The parser action a mapping key names, or None for an unknown key."""
    action = parser._option_string_actions.get("--" + _dashed(key).split(".", 1)[0])
    if action is None or isinstance(action, argparse._HelpAction | argparse._VersionAction):
        return None
    return action


def _unknown(parser: Any, key: str) -> str:
    names = [
        s[2:].replace("-", "_")
        for s, a in parser._option_string_actions.items()
        if s[:2] == "--" and _action(parser, s[2:]) is a
    ]
    close = difflib.get_close_matches(str(key).replace("-", "_"), names, n=1)
    return f"{UNKNOWN}; did you mean {close[0]}?" if close else UNKNOWN


def _refusal(parser: Any, key: str) -> str | None:
    """Why a key may not be in engine.vllm at all, or None."""
    action = _action(parser, key)
    if action is None:
        return _unknown(parser, key)
    if action.dest in OWNED:
        return f"set by the appliance: use {OWNED[action.dest]} instead"
    if action.dest == "config":
        return "a config file inside the config: put its arguments under engine.vllm instead"
    return None


def _appliance_args(
    cfg: Config | None,
    model_dir: Path | str,
    *,
    gpu_memory_utilization: float | None = None,
    kv_cache_memory_bytes: int | None = None,
) -> dict[str, Any]:
    """The appliance's own arguments (engine.* keys); None values keep vLLM's default."""
    args: dict[str, Any] = {"model": str(model_dir)}
    if cfg is not None:
        e = cfg.engine
        args |= {
            "served_model_name": [e.served_model_name or Path(model_dir).name],
            "max_model_len": e.max_model_len,
            "max_num_seqs": e.max_num_seqs,
            "max_num_batched_tokens": e.max_num_batched_tokens,
            "dtype": e.dtype,
            "kv_cache_dtype": e.kv_cache_dtype,
            "gpu_memory_utilization": gpu_memory_utilization,
            "tensor_parallel_size": e.tensor_parallel_size,
            "enforce_eager": e.enforce_eager,
            "scheduling_policy": e.scheduling_policy,
            "kv_cache_memory_bytes": kv_cache_memory_bytes,
            "seed": e.seed,
        }
    # The mapping may change these two: they are not engine.* keys.
    args |= {
        "enable_log_requests": False,
        "disable_log_stats": True,  # the appliance's stat logger is enough; keeps the log quiet
    }
    return args


def _parse(parser: Any, model_dir: Path | str, mapping: dict[str, Any]) -> argparse.Namespace:
    # The model both as `vllm serve`'s positional and as --model (what `vllm serve` sets).
    return parser.parse_args([str(model_dir), *_to_argv(parser, mapping)])


def _key_in(message: str, parser: Any, keys: list[str]) -> str:
    """The first mapping key whose flag a whole-mapping message names, else ''."""
    for key in keys:
        action = _action(parser, key)
        if action is None:
            continue
        flags = [s for s in action.option_strings if len(s) > 2]
        if any(s in message for s in flags) or re.search(rf"\b{action.dest}\b", message):
            return key
    return ""


def _one_line(message: str) -> str:
    """vLLM's (and pydantic's) multi-line messages on one line, as ConfigError lists them."""
    return " ".join(message.split())


def _registry_problems(ns: argparse.Namespace, keys: dict[str, str]) -> list[tuple[str, str]]:
    """Names vLLM looks up only when serving starts: tool and reasoning parsers,
    quantization methods. keys: vLLM dest -> the mapping's key."""
    problems: list[tuple[str, str]] = []
    checks: list[tuple[str, str | None, Any]] = []
    try:
        from vllm.tool_parsers import ToolParserManager

        checks.append(("tool_call_parser", "tool_parser_plugin", ToolParserManager.list_registered))
    except ImportError:
        pass
    try:
        from vllm.reasoning import ReasoningParserManager

        checks.append(
            ("reasoning_parser", "reasoning_parser_plugin", ReasoningParserManager.list_registered)
        )
    except ImportError:
        pass
    try:
        from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

        checks.append(("quantization", None, lambda: QUANTIZATION_METHODS))
    except ImportError:
        pass
    for dest, plugin, registered in checks:
        value = getattr(ns, dest, None)
        if not value or dest not in keys or (plugin and getattr(ns, plugin, None)):
            continue
        names = list(registered())
        if value not in names:
            problems.append((keys[dest], f"{value!r} is not one of vLLM's: {', '.join(names)}"))
    return problems


def _whole_problems(
    parser: Any, ns: argparse.Namespace, mapping: dict[str, Any]
) -> list[tuple[str, str]]:
    """What vLLM checks on the whole namespace before it loads anything."""
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    keys = list(mapping)
    dests = {a.dest: k for k in keys if (a := _action(parser, k)) is not None}
    problems = _registry_problems(ns, dests)
    for check in (validate_parsed_serve_args, engine_args_from):
        try:
            check(ns)
        except Exception as exc:  # vLLM raises TypeError, ValueError, KeyError, pydantic's...
            msg = _one_line(exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc))
            problems.append((_key_in(msg, parser, keys), msg))
    return problems


def build_namespace(
    cfg: Config,
    model_dir: Path,
    *,
    gpu_memory_utilization: float | None,
    kv_cache_memory_bytes: int | None,
    defaults: dict[str, Any] | None = None,
) -> argparse.Namespace:
    """vLLM's complete serve Namespace (engine and frontend arguments): the model dir,
    served_model_name and the engine.* keys, the appliance's defaults for this device
    (domain/engine_defaults.py), then cfg.engine.vllm on top.

    Raises VllmArgsError naming the engine.vllm key vLLM refuses."""
    mapping = dict(cfg.engine.vllm)
    parser = _parser()
    refused = [(k, why) for k in mapping if (why := _refusal(parser, k)) is not None]
    if refused:
        raise VllmArgsError(refused)
    args = _appliance_args(
        cfg,
        model_dir,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
    )
    args |= defaults or {}
    # The mapping's own spelling (dashes or underscores) must replace the same argument.
    args = {_dashed(k): v for k, v in args.items()} | {_dashed(k): v for k, v in mapping.items()}
    try:
        ns = _parse(parser, model_dir, args)
    except _ParseError as exc:
        msg = _one_line(str(exc))
        raise VllmArgsError([(_key_in(msg, parser, list(mapping)), msg)]) from None
    problems = _whole_problems(parser, ns, mapping)
    if problems:
        raise VllmArgsError(problems)
    return ns


def engine_args_from(ns: argparse.Namespace) -> AsyncEngineArgs:
    """AsyncEngineArgs from vLLM's namespace, as `vllm serve` makes them."""
    from vllm import AsyncEngineArgs

    return AsyncEngineArgs.from_cli_args(ns)


def check_vllm_mapping(mapping: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, problem) for every engine.vllm key that is unknown, owned by the appliance
    (the message names the engine.* key to use), or that vLLM's parser or EngineArgs refuse.

    Loads no model and starts no engine; an empty mapping imports nothing."""
    if not mapping:
        return []
    parser = _parser()
    problems: list[tuple[str, str]] = []
    for key, value in mapping.items():
        why = _refusal(parser, key)
        if why is None:
            try:
                _parse(parser, _CHECK_MODEL, {key: value})
            except _ParseError as exc:
                why = _one_line(str(exc))
        if why is not None:
            problems.append((str(key), why))
    if problems:  # a combined check would only repeat them or blame the wrong key
        return problems
    args = {_dashed(k): v for k, v in _appliance_args(None, _CHECK_MODEL).items()}
    args |= {_dashed(k): v for k, v in mapping.items()}
    try:
        ns = _parse(parser, _CHECK_MODEL, args)
    except _ParseError as exc:
        return [(_key_in(str(exc), parser, list(mapping)), _one_line(str(exc)))]
    return _whole_problems(parser, ns, mapping)

