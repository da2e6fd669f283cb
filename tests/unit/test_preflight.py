"""The daemon's start check (serve.preflight) and `appliance serve` on a bad model: no engine."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from appliance import cli
from appliance.adapters.nvml import Inventory, read_inventory
from appliance.daemon.run import BadModelConfig, preflight
from appliance.domain.estimator import GIB
from appliance.errors import EngineStartError
from tests.unit.test_precheck import CPU_VERSIONS, box, edit, make_config, probes, write_model

NO_GPU = Inventory("no_library", "NVML library not found")


def gpu_box(n: int = 1, memory_bytes: int | None = None) -> Inventory:
    fake = box(n)
    if memory_bytes is not None:
        for i in range(n):
            edit(fake, i, memory=SimpleNamespace(total=memory_bytes))
    return read_inventory(fake)


def run(cfg, inventory: Inventory, **probe_changes) -> list:
    return preflight(cfg, nvml=lambda: inventory, probes=probes(**probe_changes))


def test_fitting_plan_returns_the_checks_without_the_port(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, gpu_memory_utilization=0.75)
    results = {r.name: r for r in run(cfg, gpu_box())}
    assert "port" not in results  # the daemon binds it a moment later
    assert results["memory_plan"].status == "pass"
    assert results["model"].status == "pass" and "chat template" in results["model"].detail


def test_plan_that_cannot_fit_refuses_with_the_numbers(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "llama", "llama3_8b")
    (folder / "model.safetensors").unlink()
    (folder / "model.bin").write_bytes(b"")  # weights there, sized from config: 14.96 GiB
    cfg = make_config(tmp_path, model=folder, max_model_len=8192, gpu_memory_utilization=0.6)
    with pytest.raises(EngineStartError) as err:
        run(cfg, gpu_box(memory_bytes=16 * GIB))
    message = str(err.value)
    assert not isinstance(err.value, BadModelConfig)  # exit 1: the machine, not the config
    assert message.startswith("memory plan: does not fit: weights 14.96 GiB + runtime ")
    assert "leave nothing for the KV cache within the engine's 9.60 GiB" in message
    assert "(gpu_memory_utilization 0.6 of 16.00 GiB)" in message


def test_share_over_the_cap_refuses_and_names_the_value_to_set(tmp_path: Path) -> None:
    # vLLM's own default gpu_memory_utilization (0.9) + the 5 % margin breaks the 80 % cap.
    cfg = make_config(tmp_path, gpu_memory_utilization=0.9)
    with pytest.raises(EngineStartError) as err:
        run(cfg, gpu_box(memory_bytes=80 * GIB))
    assert str(err.value) == (
        "memory plan: does not fit: gpu_memory_utilization 0.9 lets the engine take 72.00 GiB; "
        "with the 4.00 GiB safety margin that is 76.00 GiB, over the 80% cap (64.00 GiB of "
        "80.00 GiB): set gpu_memory_utilization to at most 0.75"
    )


def test_the_default_share_is_worked_out_and_starts(tmp_path: Path) -> None:
    # gpu_memory_utilization null: the cap less the margin (0.75 of 80 GiB) fits.
    results = {r.name: r for r in run(make_config(tmp_path), gpu_box(memory_bytes=80 * GIB))}
    assert results["memory_plan"].status == "pass"
    assert "engine 60.0 GiB (cap 80%)" in results["memory_plan"].detail  # 0.75 of 80 GiB


def test_cpu_kv_space_that_cannot_hold_max_model_len_refuses(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "llama", "llama3_8b")
    cfg = make_config(tmp_path, model=folder, max_model_len=8192, kv_cache_space_gib=0.5)
    with pytest.raises(EngineStartError) as err:
        run(cfg, NO_GPU, package_version=CPU_VERSIONS.get, host_memory_bytes=lambda: 64 * GIB)
    assert "1 x 8192 tokens need 1.00 GiB of KV cache but 0.50 GiB is available" in str(err.value)


def test_cpu_kv_space_beyond_the_cap_of_host_memory_refuses(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, kv_cache_space_gib=20)
    with pytest.raises(EngineStartError) as err:
        run(cfg, NO_GPU, package_version=CPU_VERSIONS.get, host_memory_bytes=lambda: 24 * GIB)
    assert "KV space 20.00 GiB + weights" in str(err.value)
    assert "exceed 19.20 GiB (80% of 24.00 GiB)" in str(err.value)


def test_warnings_and_failures_are_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = make_config(tmp_path, gpu_memory_utilization=0.75)
    inventory = gpu_box()
    with caplog.at_level(logging.WARNING, logger="appliance.serve"):
        results = run(cfg, inventory, disk_free_bytes=lambda _p: 2 * GIB)
    assert {r.name: r.status for r in results}["disk_state"] == "warn"
    assert any("precheck disk_state" in rec.getMessage() for rec in caplog.records)


def test_bad_model_config_json_names_the_file(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(BadModelConfig) as err:
        run(make_config(tmp_path, model=folder), NO_GPU)
    assert str(err.value).startswith(f"bad model config: {folder / 'config.json'}: not valid JSON")


def test_bad_model_config_field_names_the_field_and_the_file(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = "thirty"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(BadModelConfig) as err:
        run(make_config(tmp_path, model=folder), gpu_box())
    assert str(err.value) == (
        f"bad model config: {folder / 'config.json'}: num_hidden_layers: "
        "must be an integer, got 'thirty'"
    )


def test_bad_weights_header_names_the_weights_file(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m")
    (folder / "model.safetensors").write_bytes(b"\x00")
    with pytest.raises(BadModelConfig) as err:
        run(make_config(tmp_path, model=folder), NO_GPU)
    assert str(err.value) == (
        f"bad model config: {folder / 'model.safetensors'}: too short to be a safetensors file"
    )


# -- `appliance serve` exits 2 with one line, not a traceback --------------------------------------


def _serve(tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr("appliance.json_log.setup_logging", lambda *a, **k: None)
    path = tmp_path / "config.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\nengine:\n  model: {model}\n")
    return cli.main(["serve", "--config", str(path)])


def test_serve_with_a_broken_model_config_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_model(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    del config["hidden_size"]
    (folder / "config.json").write_text(json.dumps(config))
    assert _serve(tmp_path, folder, monkeypatch) == 2
    err = capsys.readouterr().err
    assert err == (
        f"cannot start: bad model config: {folder / 'config.json'}: hidden_size: "
        "missing from config.json\n"
    )


def test_serve_without_a_model_folder_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _serve(tmp_path, tmp_path / "nowhere", monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.startswith("cannot start: engine.model: ") and "no config.json" in err
    assert "Traceback" not in err
