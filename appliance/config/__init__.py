"""Typed, frozen configuration: parsed once, every bad key reported at once."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from appliance.config.maintenance import MaintenanceConfig
from appliance.config.section import (
    CrossFieldError,
    Section,
    SectionProblems,
    key_path,
    policy_problems,
)
from appliance.config.telemetry import TelemetryConfig, ThermalConfig
from appliance.domain.controller import ControllerConfig
from appliance.domain.limits import CONCURRENCY_LIMIT_MAX, CONCURRENCY_LIMIT_MIN, InvariantError
from appliance.domain.sweep_analysis import ScoreWeights
from appliance.errors import ConfigError

DEFAULT_MODEL = "default"
DEFAULT_MODEL_DIRNAME = "SmolLM2-135M-Instruct"
SYSTEM_CONFIG_PATH = Path("/etc/appliance/config.yaml")


class ServerConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_body_bytes: int = Field(1_048_576, ge=1024, le=256 * 1_048_576)
    # Plain client keys with every lane and no limits (the older way; `appliance keys add`
    # keeps keys hashed, with lanes and limits). No key at all: the API is open to anyone
    # who can reach the port.
    api_keys: tuple[str, ...] = ()
    # Where the admin token comes from when $APPLIANCE_ADMIN_TOKEN is unset.
    admin_token_file: str = "admin.token"


class EngineConfig(Section):
    model: str = DEFAULT_MODEL
    served_model_name: str | None = None
    max_model_len: int = Field(2048, ge=64, le=1_048_576)
    # A concurrency limit like any other: it is the controller's ceiling when
    # controller.max_limit is null.
    max_num_seqs: int = Field(64, ge=CONCURRENCY_LIMIT_MIN, le=CONCURRENCY_LIMIT_MAX)
    max_num_batched_tokens: int | None = Field(None, ge=64)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "bfloat16"
    # auto: fp8 on GPUs with compute capability >= 8.9, else the model's dtype
    # (domain/engine_defaults.py); an explicit value is given to vLLM as it is.
    kv_cache_dtype: Literal["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    kv_cache_space_gib: float = Field(1.0, gt=0, le=1024)
    # Share of each device (GPU memory; host RAM on the CPU engine) the memory plan may use,
    # the safety margin max(2 GiB, 5 %) included.
    usable_memory_fraction: float = Field(0.8, gt=0.05, le=1.0)
    # vLLM's share of each GPU; None: worked out at start from usable_memory_fraction less
    # the margin on the smallest GPU (0.75 on an 80 GB card). A set value plus the margin
    # must stay within usable_memory_fraction, or the start is refused with the numbers.
    gpu_memory_utilization: float | None = Field(None, gt=0.05, le=0.99)
    tensor_parallel_size: int = Field(1, ge=1, le=8)
    # False: the compiled path (torch.compile on CPU, CUDA graphs on GPU), faster decode at
    # the cost of a slower engine start; True: eager, faster start and restart.
    enforce_eager: bool = False
    # priority: vLLM schedules by the request's lane (realtime first) inside the engine too.
    scheduling_policy: Literal["fcfs", "priority"] = "priority"
    seed: int = 0
    start_timeout_s: float = Field(600.0, gt=0)
    drain_timeout_s: float = Field(60.0, gt=0, le=3600)
    health_interval_s: float = Field(2.0, gt=0, le=300)
    restart_backoff_initial_s: float = Field(1.0, gt=0)
    restart_backoff_max_s: float = Field(60.0, gt=0)
    max_tokens_default: int = Field(256, ge=1)
    # Any other vLLM engine or frontend argument, named as `vllm serve`'s flags (underscores
    # or dashes): block_size, enable_prefix_caching, speculative_config, tool_call_parser...
    # Checked against vLLM's own parser at the CLI and serve edge (adapters/vllm_args.py);
    # the keys above that the appliance owns are refused there, naming engine.<field>.
    vllm: dict[str, Any] = Field(default_factory=dict)

    @property
    def vllm_block_size(self) -> int | None:
        """engine.vllm's block_size (either spelling), when it sets a whole number."""
        value = self.vllm.get("block_size", self.vllm.get("block-size"))
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @model_validator(mode="after")
    def _backoff_order(self) -> EngineConfig:
        if self.restart_backoff_max_s < self.restart_backoff_initial_s:
            raise ValueError(
                "restart_backoff_max_s must be >= restart_backoff_initial_s "
                f"({self.restart_backoff_initial_s})"
            )
        return self


class LaneConfig(Section):
    realtime: int = Field(64, ge=0, le=100_000)
    interactive: int = Field(256, ge=0, le=100_000)
    batch: int = Field(1024, ge=0, le=100_000)


class LaneDeadlines(Section):
    """Default deadline per lane (ms) for requests that send no deadline_ms; None: none."""

    realtime: int | None = Field(500, ge=1, le=3_600_000)
    interactive: int | None = Field(None, ge=1, le=3_600_000)
    batch: int | None = Field(None, ge=1, le=3_600_000)

    def for_lane(self, lane: str) -> int | None:
        """The default for a lane by its name."""
        return getattr(self, lane)


class AdmissionConfig(Section):
    # None: engine.max_num_seqs (the engine cannot run more anyway); resolve it with
    # Config.concurrency_limit().
    concurrency_limit: int | None = Field(None, ge=CONCURRENCY_LIMIT_MIN, le=CONCURRENCY_LIMIT_MAX)
    max_queue_wait_s: float = Field(60.0, gt=0, le=3600)
    queue_capacity: LaneConfig = LaneConfig()
    # Share of the limit only realtime requests may use, so a batch flood cannot take it all.
    realtime_reserved_share: float = Field(0.125, ge=0, le=0.9)
    retry_after_s: int = Field(2, ge=1, le=3600)
    lane_deadline_ms: LaneDeadlines = LaneDeadlines()


class LongContextConfig(Section):
    """Prompts longer than the context: refuse (error) or read them in chunks."""

    # error: 400 context_length_exceeded unless the request says long_context: "chunk".
    # chunk: every chat prompt over the context is chunked unless it says "error".
    mode: Literal["error", "chunk"] = "error"
    strategy: Literal["refine", "map_reduce"] = "refine"
    chunk_tokens: int = Field(1024, ge=64, le=1_048_576)
    overlap_tokens: int = Field(128, ge=0, le=65_536)
    # The opening of the long message (where the request usually is) carried into every pass.
    carry_head_tokens: int = Field(128, ge=0, le=65_536)
    # Most tokens an intermediate pass (a part's answer) may generate.
    intermediate_max_tokens: int = Field(128, ge=1, le=65_536)
    # Hard cap: a longer prompt gets 413 naming this key, chunked or not.
    max_prompt_tokens: int = Field(65_536, ge=64, le=16_777_216)

    @model_validator(mode="after")
    def _overlap_below_chunk(self) -> LongContextConfig:
        if self.overlap_tokens >= self.chunk_tokens:
            raise ValueError(
                f"overlap_tokens ({self.overlap_tokens}) must be < chunk_tokens "
                f"({self.chunk_tokens})"
            )
        return self


class SloConfig(Section):
    """Latency objectives: what the controller steers to and the alerts measure against."""

    # Their range is the controller policy's (appliance.domain.limits.SLO_MIN_S..SLO_MAX_S),
    # checked when Config builds the policy (Config._controller_policy).
    ttft_p99_s: float = 5.0
    tpot_p99_s: float = 0.5


class ControllerSettings(Section):
    """The batch controller: auto steers the limit to the SLO; manual holds `limit`."""

    # What the policy needs of these numbers (the limit range, positive periods, ratios in
    # (0, 1]...) is the policy's own (ControllerConfig), checked once Config has the slo and
    # engine sections too (Config._controller_policy); the ceilings here only catch a typo.
    mode: Literal["auto", "manual"] = "auto"
    min_limit: int = 1
    # None: engine.max_num_seqs (the engine cannot run more anyway).
    max_limit: int | None = None
    tick_s: float = Field(2.0, le=3600)
    window_s: float = Field(30.0, le=86400)
    min_samples: int = Field(8, le=100_000)
    kv_high_ratio: float = 0.9
    decrease_factor: float = 0.75
    increase_step: int = Field(1, le=1024)
    # auto: the load predictor's forecast may raise the limit ahead of a burst (the LSTM
    # where it beat the EWMA baseline on this box's own history, else the EWMA); off: never.
    forecast: Literal["off", "auto"] = "auto"
    forecast_horizon_s: float = Field(30.0, gt=0, le=3600)
    # Prefill budget (auto mode): prompt tokens admitted and still without a first token stay
    # under what the engine clears in this share of the TTFT SLO; null: count alone.
    prefill_ttft_share: float | None = 0.5
    # Auto mode: an interactive request whose first token would come later than this many
    # TTFT SLOs (measured prefill rate, prompt work ahead of it) gets 429 at once instead of
    # a late answer that counts for nothing; null: queue everything.
    shed_above_ttft_ratio: float | None = 1.0

    def to_policy(self, slo: SloConfig, max_num_seqs: int) -> ControllerConfig:
        """The pure policy's frozen config; InvariantError when the numbers break its limits."""
        return ControllerConfig(
            slo_ttft_p99_s=slo.ttft_p99_s,
            slo_tpot_p99_s=slo.tpot_p99_s,
            min_limit=self.min_limit,
            max_limit=max_num_seqs if self.max_limit is None else self.max_limit,
            tick_s=self.tick_s,
            window_s=self.window_s,
            min_samples=self.min_samples,
            kv_high_ratio=self.kv_high_ratio,
            kv_probe_max_ratio=min(0.8, self.kv_high_ratio),
            decrease_factor=self.decrease_factor,
            increase_step=self.increase_step,
            prefill_ttft_share=self.prefill_ttft_share,
            shed_above_ttft_ratio=self.shed_above_ttft_ratio,
        )


class ScoreWeightsConfig(Section):
    """Weights of the benchmark's score (normalised, so they need not sum to 1)."""

    # >= 0 and at least one > 0 is the score's own rule (ScoreWeights); 100 catches a typo.
    latency: float = Field(0.4, le=100)
    throughput: float = Field(0.3, le=100)
    utilisation: float = Field(0.2, le=100)
    energy: float = Field(0.1, le=100)

    @model_validator(mode="after")
    def _valid_weights(self) -> ScoreWeightsConfig:
        try:
            self.to_policy()
        except InvariantError as exc:
            # The score names its fields weights.<name>, and the rule on all of them weights.
            key_of = {f"weights.{name}": name for name in type(self).model_fields}
            raise SectionProblems(policy_problems(exc, {**key_of, "weights": ""})) from None
        return self

    def to_policy(self) -> ScoreWeights:
        """The score's frozen weights."""
        return ScoreWeights(self.latency, self.throughput, self.utilisation, self.energy)


class BenchConfig(Section):
    weights: ScoreWeightsConfig = ScoreWeightsConfig()


class AuditConfig(Section):
    """The per-request audit log (state_dir/audit.db)."""

    enabled: bool = True
    # The prompt and answer text beside their SHA-256; off: only the hashes are kept.
    store_text: bool = False
    retention_days: int = Field(90, ge=1, le=3650)
    # A cap on the file; when it is reached records are dropped (counted, alerted), never
    # a request failed. null: bounded by the disk only.
    max_size_mib: int | None = Field(1024, ge=1)


class LoggingConfig(Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    json_lines: bool = True


class Config(Section):
    state_dir: Path = Path("./state")
    server: ServerConfig = ServerConfig()
    engine: EngineConfig = EngineConfig()
    # Checked against engine (and slo) even when absent: a default may break a rule with them.
    admission: AdmissionConfig = Field(AdmissionConfig(), validate_default=True)
    long_context: LongContextConfig = LongContextConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    thermal: ThermalConfig = ThermalConfig()
    slo: SloConfig = SloConfig()
    controller: ControllerSettings = Field(ControllerSettings(), validate_default=True)
    maintenance: MaintenanceConfig = MaintenanceConfig()
    bench: BenchConfig = BenchConfig()
    audit: AuditConfig = AuditConfig()
    logging: LoggingConfig = LoggingConfig()

    # Rules across sections are field validators of the later section, not one model
    # validator: pydantic runs those even when another section failed, so a file's problems
    # are all reported at once. A section that failed itself is missing from info.data.

    @field_validator("admission")
    @classmethod
    def _admission_within_engine(
        cls, admission: AdmissionConfig, info: ValidationInfo
    ) -> AdmissionConfig:
        engine: EngineConfig | None = info.data.get("engine")
        limit = admission.concurrency_limit
        if engine is not None and limit is not None and limit > engine.max_num_seqs:
            raise CrossFieldError(
                [
                    (
                        "admission.concurrency_limit",
                        f"{limit} is above engine.max_num_seqs ({engine.max_num_seqs}): the "
                        "engine cannot run more; raise engine.max_num_seqs or use null "
                        "(= engine.max_num_seqs)",
                    )
                ]
            )
        return admission

    @field_validator("controller")
    @classmethod
    def _controller_policy(
        cls, ctl: ControllerSettings, info: ValidationInfo
    ) -> ControllerSettings:
        """Build the controller's policy: its limits, named by the keys that set them."""
        slo: SloConfig | None = info.data.get("slo")
        engine: EngineConfig | None = info.data.get("engine")
        if slo is None or engine is None:
            return ctl  # their own problems are reported; the policy waits for a clean file
        try:
            ctl.to_policy(slo, engine.max_num_seqs)
        except InvariantError as exc:
            raise CrossFieldError(_controller_problems(exc, ctl)) from None
        return ctl

    def concurrency_limit(self) -> int:
        """admission.concurrency_limit, or engine.max_num_seqs when that is None."""
        limit = self.admission.concurrency_limit
        return self.engine.max_num_seqs if limit is None else limit

    def with_overrides(self, **server: Any) -> Config:
        """A copy with server fields (host, port) replaced where given."""
        changes = {k: v for k, v in server.items() if v is not None}
        if not changes:
            return self
        return self.model_copy(update={"server": self.server.model_copy(update=changes)})


def _controller_problems(exc: InvariantError, ctl: ControllerSettings) -> list[tuple[str, str]]:
    """The controller policy's problems under the yaml keys that set each of its fields."""
    key_of = {name: f"controller.{name}" for name in ControllerSettings.model_fields}
    key_of |= {
        "slo_ttft_p99_s": "slo.ttft_p99_s",
        "slo_tpot_p99_s": "slo.tpot_p99_s",
        # Derived from kv_high_ratio (at most 0.8 of it): that is the key to change.
        "kv_probe_max_ratio": "controller.kv_high_ratio",
    }
    if ctl.max_limit is None:
        key_of["max_limit"] = "engine.max_num_seqs"
    problems = policy_problems(exc, key_of)
    if ctl.max_limit is not None:
        return problems
    # Say why engine.max_num_seqs answers for a limit of the controller's.
    note = " (the controller's ceiling while controller.max_limit is null)"
    return [
        (key, msg + note if p.field == "max_limit" else msg)
        for (key, msg), p in zip(problems, exc.problems, strict=True)
    ]


def parse_config(data: Any, source: str = "<config>") -> Config:
    """Validate a mapping into a Config; ConfigError lists every bad key."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, [("<root>", "must be a mapping of keys")])
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            keyed = err.get("ctx", {}).get("error")
            if isinstance(keyed, SectionProblems):
                problems.extend(keyed.keyed(err["loc"]))
                continue
            key = key_path(err["loc"])
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append((key, msg))
        raise ConfigError(source, problems) from None


def find_config_path(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """Config search order: --config, $APPLIANCE_CONFIG, /etc/appliance, ./config.yaml."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("APPLIANCE_CONFIG")
    if env:
        return Path(env)
    for candidate in (SYSTEM_CONFIG_PATH, Path("config.yaml")):
        if candidate.is_file():
            return candidate
    return None


def load_config(path: str | os.PathLike[str] | None) -> Config:
    """Read and validate a YAML config file; None gives the defaults."""
    if path is None:
        return Config()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(p), [("<file>", "not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(p), [("<file>", f"unreadable: {exc}")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(p), [("<yaml>", str(exc).replace("\n", " "))]) from None
    return parse_config(data, str(p))


def resolve_model_dir(cfg: Config) -> Path:
    """The folder the engine loads: the converted default model, or the configured one."""
    if cfg.engine.model == DEFAULT_MODEL:
        return (cfg.state_dir / "models" / DEFAULT_MODEL_DIRNAME).resolve()
    return Path(cfg.engine.model).expanduser().resolve()


def served_model_name(cfg: Config) -> str:
    """The model id clients use in requests and see in /v1/models."""
    if cfg.engine.served_model_name:
        return cfg.engine.served_model_name
    return resolve_model_dir(cfg).name
