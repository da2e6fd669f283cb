"""Config: defaults, every bad key named at once, the CLI's exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from appliance.cli import main
from appliance.config import Config, find_config_path, load_config, resolve_model_dir
from appliance.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_config_is_valid_and_equals_the_defaults():
    assert load_config(ROOT / "config.yaml") == Config()


def test_every_bad_key_is_reported_at_once(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "server:\n  port: 70000\n  colour: blue\n"
        "engine:\n  max_model_len: 10\n  drain_timeout_s: -1\n"
        "admission:\n  queue_capacity:\n    batch: -5\n"
        "nonsense: 1\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    keys = {k for k, _ in err.value.problems}
    assert keys == {
        "server.port",
        "server.colour",
        "engine.max_model_len",
        "engine.drain_timeout_s",
        "admission.queue_capacity.batch",
        "nonsense",
    }
    msg = dict(err.value.problems)
    assert msg["server.colour"] == "unknown key"
    assert "65535" in msg["server.port"]


def test_config_check_exits_2_and_names_each_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine:\n  dtype: float8\n  modle: x\n")
    assert main(["config", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "engine.dtype" in err and "engine.modle: unknown key" in err


def test_config_check_ok_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["config", "check", str(ROOT / "config.yaml")]) == 0
    assert main(["config", "check", str(tmp_path / "nope.yaml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_yaml_syntax_error_is_a_config_error(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: [unclosed\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert err.value.problems[0][0] == "<yaml>"


def test_backoff_order_is_checked():
    from appliance.config import parse_config

    with pytest.raises(ConfigError) as err:
        parse_config({"engine": {"restart_backoff_initial_s": 10, "restart_backoff_max_s": 1}})
    assert "restart_backoff_max_s" in err.value.problems[0][1]


def test_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("APPLIANCE_CONFIG", raising=False)
    explicit = tmp_path / "a.yaml"
    assert find_config_path(str(explicit)) == explicit
    monkeypatch.setenv("APPLIANCE_CONFIG", str(tmp_path / "env.yaml"))
    assert find_config_path(None) == tmp_path / "env.yaml"
    monkeypatch.delenv("APPLIANCE_CONFIG")
    (tmp_path / "config.yaml").write_text("{}\n")
    if not Path("/etc/appliance/config.yaml").exists():
        assert find_config_path(None) == Path("config.yaml")


def test_default_model_lives_in_the_state_dir(tmp_path: Path):
    cfg = Config(state_dir=tmp_path)
    assert resolve_model_dir(cfg) == (tmp_path / "models" / "SmolLM2-135M-Instruct").resolve()


def test_python_dash_m_runs_the_cli():
    out = subprocess.run(
        [sys.executable, "-m", "appliance", "--help"], capture_output=True, text=True, check=True
    )
    assert "serve" in out.stdout and "config" in out.stdout


# -- cross-field rules: one bad file per rule, the ConfigError names both keys -------------------

CROSS_FIELD_CASES = [
    pytest.param(
        "engine:\n  max_num_seqs: 8\nadmission:\n  concurrency_limit: 9\n",
        "admission.concurrency_limit",
        "engine.max_num_seqs",
        id="concurrency_limit-above-max_num_seqs",
    ),
    pytest.param(
        "controller:\n  min_limit: 8\n  max_limit: 4\n",
        "controller.max_limit",
        "controller.min_limit",
        id="min_limit-above-max_limit",
    ),
    pytest.param(
        "engine:\n  max_num_seqs: 4\ncontroller:\n  min_limit: 8\n",
        "engine.max_num_seqs",
        "controller.min_limit",
        id="min_limit-above-max_num_seqs-when-max_limit-null",
    ),
]


@pytest.mark.parametrize(("text", "key", "other_key"), CROSS_FIELD_CASES)
def test_cross_field_rules_name_both_keys(tmp_path: Path, text: str, key: str, other_key: str):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert [k for k, _ in err.value.problems] == [key]
    assert other_key in err.value.problems[0][1]
    assert key in str(err.value) and other_key in str(err.value)


def test_cross_field_rules_report_together():
    from appliance.config import parse_config

    with pytest.raises(ConfigError) as err:
        parse_config(
            {
                "engine": {"max_num_seqs": 4},
                "admission": {"concurrency_limit": 5},
                "controller": {"min_limit": 3, "max_limit": 2},
            }
        )
    assert {k for k, _ in err.value.problems} == {
        "admission.concurrency_limit",
        "controller.max_limit",
    }


# -- policy limits: stated once, in the domain, named here by the yaml key that sets them ----------

POLICY_LIMIT_CASES = [
    pytest.param("slo:\n  ttft_p99_s: 0\n", "slo.ttft_p99_s", "[0.001, 3600] s", id="slo-min"),
    pytest.param("slo:\n  tpot_p99_s: 7200\n", "slo.tpot_p99_s", "[0.001, 3600] s", id="slo-max"),
    pytest.param(
        "controller:\n  min_limit: 0\n", "controller.min_limit", "[1, 4096]", id="limit-range"
    ),
    pytest.param(
        "controller:\n  kv_high_ratio: 1.5\n",
        "controller.kv_high_ratio",
        "(0, 1]",
        id="kv_high_ratio",
    ),
    pytest.param(
        "controller:\n  decrease_factor: 1\n",
        "controller.decrease_factor",
        "(0, 1)",
        id="decrease_factor",
    ),
    pytest.param("controller:\n  tick_s: 0\n", "controller.tick_s", "> 0", id="tick_s"),
    pytest.param(
        "controller:\n  shed_above_ttft_ratio: 0\n",
        "controller.shed_above_ttft_ratio",
        "(0, 10] or null",
        id="shed_above_ttft_ratio",
    ),
    pytest.param(
        "thermal:\n  step_factor: 1.0\n", "thermal.step_factor", "(0, 1)", id="step_factor"
    ),
    pytest.param("thermal:\n  hysteresis_c: 0\n", "thermal.hysteresis_c", "> 0", id="hysteresis_c"),
    pytest.param(
        "bench:\n  weights:\n    latency: -1\n",
        "bench.weights.latency",
        ">= 0",
        id="weight-negative",
    ),
    pytest.param(
        "bench:\n  weights: {latency: 0, throughput: 0, utilisation: 0, energy: 0}\n",
        "bench.weights",
        "at least one weight must be > 0",
        id="weights-all-zero",
    ),
]


@pytest.mark.parametrize(("text", "key", "limit"), POLICY_LIMIT_CASES)
def test_policy_limits_name_the_key_and_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, key: str, limit: str
):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert [k for k, _ in err.value.problems] == [key]
    assert limit in err.value.problems[0][1]
    assert main(["config", "check", str(bad)]) == 2
    assert f"{key}: " in capsys.readouterr().err


def test_policy_limits_are_reported_with_every_other_problem():
    from appliance.config import parse_config

    with pytest.raises(ConfigError) as err:
        parse_config(
            {
                "server": {"port": 70000},
                "engine": {"max_num_seqs": 4},
                "admission": {"concurrency_limit": 5},
                "slo": {"ttft_p99_s": 0},
                "controller": {"kv_high_ratio": 2},
                "thermal": {"floor_factor": 0},
            }
        )
    assert {k for k, _ in err.value.problems} == {
        "server.port",
        "admission.concurrency_limit",
        "slo.ttft_p99_s",
        "controller.kv_high_ratio",
        "thermal.floor_factor",
    }


def test_the_config_accepts_what_the_policy_accepts():
    from appliance.config import parse_config
    from appliance.domain.limits import CONCURRENCY_LIMIT_MAX, SLO_MAX_S, SLO_MIN_S

    cfg = parse_config(
        {
            "engine": {"max_num_seqs": CONCURRENCY_LIMIT_MAX},
            "slo": {"ttft_p99_s": SLO_MAX_S, "tpot_p99_s": SLO_MIN_S},
        }
    )
    policy = cfg.controller.to_policy(cfg.slo, cfg.engine.max_num_seqs)
    assert (policy.max_limit, policy.slo_ttft_p99_s) == (CONCURRENCY_LIMIT_MAX, SLO_MAX_S)


def test_concurrency_limit_defaults_to_max_num_seqs():
    from appliance.config import parse_config

    assert Config().admission.concurrency_limit is None
    assert Config().concurrency_limit() == Config().engine.max_num_seqs
    cfg = parse_config({"engine": {"max_num_seqs": 12}})
    assert cfg.concurrency_limit() == 12
    cfg = parse_config({"engine": {"max_num_seqs": 12}, "admission": {"concurrency_limit": 12}})
    assert cfg.concurrency_limit() == 12
    cfg = parse_config({"engine": {"max_num_seqs": 12}, "admission": {"concurrency_limit": 3}})
    assert cfg.concurrency_limit() == 3


def test_admission_queue_starts_at_the_resolved_limit():
    from appliance.config import parse_config
    from appliance.services.admission import AdmissionQueue

    cfg = parse_config({"engine": {"max_num_seqs": 12}})
    assert AdmissionQueue(cfg.admission, limit=cfg.concurrency_limit()).base_limit == 12
    with pytest.raises(ValueError, match="concurrency_limit"):
        AdmissionQueue(cfg.admission)


def test_compiled_path_is_the_default():
    assert Config().engine.enforce_eager is False
    assert Config().engine.vllm == {}


# -- engine.vllm: vLLM's own parser checks the mapping (no engine, no model) ---------------------


@pytest.fixture(scope="module")
def vllm_args():
    pytest.importorskip("vllm")
    from appliance.adapters import vllm_args

    return vllm_args


def test_a_good_vllm_mapping_passes(vllm_args):
    mapping = {
        "block_size": 16,
        "enable-prefix-caching": False,
        "enable_auto_tool_choice": True,
        "tool_call_parser": "hermes",
        "speculative_config": {"method": "ngram", "num_speculative_tokens": 4},
        "compilation_config": {"mode": 3},
        "enable_lora": True,
        "lora_modules": [{"name": "a", "path": "/adapters/a"}],
        "kv_offloading_size": 4,
    }
    assert vllm_args.check_vllm_mapping(mapping) == []
    assert vllm_args.check_vllm_mapping({}) == []


VLLM_MAPPING_CASES = [
    pytest.param({"blok_size": 16}, "blok_size", "unknown vLLM engine argument", id="unknown"),
    pytest.param({"block_size": "abc"}, "block_size", "invalid int value", id="ill-typed"),
    pytest.param({"dtype_x": 1}, "dtype_x", "unknown vLLM engine argument", id="unknown-2"),
    pytest.param(
        {"max_num_seqs": 4}, "max_num_seqs", "engine.max_num_seqs", id="owned-max_num_seqs"
    ),
    pytest.param(
        {"max-model-len": 4096}, "max-model-len", "engine.max_model_len", id="owned-dashed"
    ),
    pytest.param(
        {"kv_cache_memory_bytes": 2**30},
        "kv_cache_memory_bytes",
        "engine.kv_cache_space_gib",
        id="owned-kv-bytes",
    ),
    pytest.param(
        {"enable_auto_tool_choice": True},
        "enable_auto_tool_choice",
        "--tool-call-parser",
        id="auto-tool-choice-needs-a-parser",
    ),
    pytest.param(
        {"tool_call_parser": "no_such_parser"}, "tool_call_parser", "hermes", id="bad-parser"
    ),
    pytest.param(
        {"compilation_config": {"no_such_field": 1}},
        "compilation_config",
        "no_such_field",
        id="bad-nested-json",
    ),
]


@pytest.mark.parametrize(("mapping", "key", "words"), VLLM_MAPPING_CASES)
def test_a_bad_vllm_mapping_names_the_key(vllm_args, mapping, key, words):
    problems = vllm_args.check_vllm_mapping(mapping)
    assert [k for k, _ in problems] == [key]
    assert words in problems[0][1]
    assert "\n" not in problems[0][1]


def test_config_check_names_every_bad_vllm_key(
    vllm_args, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "engine:\n  vllm:\n    block_size: abc\n    blok_size: 16\n    max_num_seqs: 4\n"
        "    enable_prefix_caching: true\n"
    )
    assert main(["config", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "engine.vllm.block_size: argument --block-size: invalid int value" in err
    assert "engine.vllm.blok_size: unknown vLLM engine argument" in err
    assert "engine.vllm.max_num_seqs: set by the appliance: use engine.max_num_seqs" in err
    assert "enable_prefix_caching" not in err
    good = tmp_path / "good.yaml"
    good.write_text("engine:\n  vllm:\n    enable_prefix_caching: false\n    block_size: 16\n")
    assert main(["config", "check", str(good)]) == 0


def test_serve_with_a_bad_vllm_mapping_exits_2(
    vllm_args, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setattr("appliance.json_log.setup_logging", lambda *a, **k: None)

    def no_daemon(cfg):  # the check must refuse before anything starts
        raise AssertionError("the daemon started")

    monkeypatch.setattr("appliance.daemon.run.run_daemon", no_daemon)
    path = tmp_path / "config.yaml"
    path.write_text(f"state_dir: {tmp_path}\nengine:\n  vllm:\n    block_sise: 16\n")
    assert main(["serve", "--config", str(path)]) == 2
    assert "engine.vllm.block_sise: unknown vLLM engine argument" in capsys.readouterr().err


def test_build_namespace_puts_the_mapping_into_the_engine_args(vllm_args, tmp_path: Path):
    from appliance.config import parse_config

    cfg = parse_config(
        {
            "engine": {
                "max_num_seqs": 12,
                "max_model_len": 1024,
                "served_model_name": "m1",
                "vllm": {
                    "enable_prefix_caching": False,
                    "block-size": 16,
                    "tool_call_parser": "hermes",
                    "enable_auto_tool_choice": True,
                },
            }
        }
    )
    ns = vllm_args.build_namespace(
        cfg, tmp_path / "model", gpu_memory_utilization=None, kv_cache_memory_bytes=2**30
    )
    args = vllm_args.engine_args_from(ns)
    assert (args.block_size, args.enable_prefix_caching) == (16, False)
    assert args.model == str(tmp_path / "model") and ns.model_tag == args.model
    assert list(args.served_model_name) == ["m1"]
    assert (args.max_num_seqs, args.max_model_len) == (12, 1024)
    assert args.kv_cache_memory_bytes == 2**30
    assert args.enforce_eager is False and args.disable_log_stats is True
    # Frontend arguments are there too, for vLLM's serving layer.
    assert ns.tool_call_parser == "hermes" and ns.enable_auto_tool_choice is True
    assert ns.chat_template is None and hasattr(ns, "response_role")


def test_build_namespace_refuses_an_owned_key(vllm_args, tmp_path: Path):
    from appliance.config import parse_config

    cfg = parse_config({"engine": {"vllm": {"seed": 3}}})
    with pytest.raises(vllm_args.VllmArgsError, match=r"engine\.vllm\.seed: .*engine\.seed"):
        vllm_args.build_namespace(
            cfg, tmp_path, gpu_memory_utilization=0.5, kv_cache_memory_bytes=None
        )


def test_config_check_names_model_and_vllm_mapping_keys_together(
    vllm_args, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    # A file with a cross-field error and a bad engine.vllm key: both are named at once.
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "controller: {min_limit: 8, max_limit: 4}\nengine:\n  vllm:\n    blok_size: 16\n"
    )
    assert main(["config", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "controller.max_limit: must be >= controller.min_limit (8), got 4" in err
    assert "engine.vllm.blok_size: unknown vLLM engine argument" in err


def test_shedding_ratio_reaches_the_policy_and_null_turns_it_off():
    from appliance.config import parse_config

    cfg = parse_config({"controller": {"shed_above_ttft_ratio": 2.0}})
    assert cfg.controller.to_policy(cfg.slo, 64).shed_above_ttft_ratio == 2.0
    cfg = parse_config({"controller": {"shed_above_ttft_ratio": None}})
    assert cfg.controller.to_policy(cfg.slo, 64).shed_above_ttft_ratio is None
    assert Config().controller.to_policy(Config().slo, 64).shed_above_ttft_ratio == 1.0
