"""GET /admin/estimate and /admin/precheck through the real aiohttp app (fake engine), and the
agreement of the daemon's plan with `appliance estimate` on the same inputs."""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from appliance.commands import estimate as estimate_cmd
from appliance.config import Config, parse_config
from appliance.daemon.app import build_app
from appliance.daemon.run import preflight
from appliance.domain.estimator import GIB
from appliance.precheck import exit_code, plan_for_config
from tests.fakes import FakeEngine, WordTokenizer
from tests.unit.test_precheck import write_model

MAX_MODEL_LEN = 2048


def _cfg(tmp_path: Path, model: Path) -> Config:
    return parse_config(
        {
            "state_dir": str(tmp_path / "state"),
            "engine": {
                "model": str(model),
                "max_model_len": MAX_MODEL_LEN,
                "max_num_seqs": 64,
                "kv_cache_space_gib": 1,
                # Within the 80 % cap on any GPU this may run on (0.5 + margin <= 0.8).
                "gpu_memory_utilization": 0.5,
                "drain_timeout_s": 5,
            },
            "telemetry": {"source": "sim"},
        }
    )


class Api:
    def __init__(self, client: TestClient, cfg: Config, model: Path, token: str) -> None:
        self.client, self.cfg, self.model, self.token = client, cfg, model, token

    async def get(self, path: str) -> tuple[int, dict]:
        r = await self.client.get(path, headers={"Authorization": f"Bearer {self.token}"})
        return r.status, await r.json()


@pytest.fixture
async def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Api]:
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    model = write_model(tmp_path / "models" / "smol")
    cfg = _cfg(tmp_path, model)
    app = build_app(cfg, lambda: FakeEngine(token_delay_s=0.001), WordTokenizer())
    client = TestClient(TestServer(app))
    await client.start_server()
    token = (tmp_path / "state" / "admin.token").read_text().strip()
    yield Api(client, cfg, model, token)
    await client.close()


async def test_estimate_needs_the_admin_token(api: Api) -> None:
    r = await api.client.get("/admin/estimate")
    assert r.status == 401


async def test_estimate_is_the_daemon_plan(api: Api) -> None:
    status, body = await api.get("/admin/estimate")
    assert status == 200
    assert body == plan_for_config(api.cfg).to_dict()
    assert body["model"] == "smol" and body["seq_len"] == MAX_MODEL_LEN
    assert body["batch_size"] == 1 and body["max_num_seqs"] == 64
    assert body["fits"] and body["reason"].startswith("fits")
    assert body["usable_fraction"] == 0.8 and len(body["batch_table"]) == 6
    if body["device"] == "cpu":
        assert body["kv_budget_bytes"] == GIB and body["gpu_memory_utilization"] is None
    else:
        assert body["gpu_memory_utilization"] == 0.5


async def test_estimate_what_ifs_and_bad_queries(api: Api) -> None:
    status, body = await api.get("/admin/estimate?seq_len=4096&batch_size=8")
    assert status == 200 and (body["seq_len"], body["batch_size"]) == (4096, 8)
    assert body["kv_cache_bytes"] == 8 * body["kv_bytes_per_sequence"]
    status, body = await api.get("/admin/estimate?seq_len=0")
    assert status == 400 and body["error"]["param"] == "seq_len"
    status, body = await api.get("/admin/estimate?batch_size=many")
    assert status == 400 and body["error"]["param"] == "batch_size"


async def test_estimate_with_a_broken_model_config_names_the_key(api: Api) -> None:
    config = json.loads((api.model / "config.json").read_text())
    del config["num_hidden_layers"]
    (api.model / "config.json").write_text(json.dumps(config))
    status, body = await api.get("/admin/estimate")
    assert status == 400
    assert body["error"]["message"] == "num_hidden_layers: missing from config.json"


async def test_estimate_agrees_with_the_cli(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    _, daemon = await api.get("/admin/estimate")
    argv = [
        "estimate",
        "--model",
        str(api.model),
        "--gpu-memory-gib",
        repr(daemon["device_memory_bytes"] / GIB),
        "--seq-len",
        str(MAX_MODEL_LEN),
        "--dtype",
        api.cfg.engine.dtype,
        "--kv-dtype",
        api.cfg.engine.kv_cache_dtype,
        "--max-num-seqs",
        str(api.cfg.engine.max_num_seqs),
        "--device",
        daemon["device"],
        "--json",
    ]
    if daemon["device"] == "cpu":
        argv += ["--kv-cache-space-gib", str(api.cfg.engine.kv_cache_space_gib)]
    else:
        argv += ["--gpu-memory-utilization", str(api.cfg.engine.gpu_memory_utilization)]
    parser = argparse.ArgumentParser()
    estimate_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["plan"] == daemon


async def test_precheck_serves_the_start_results(api: Api) -> None:
    status, body = await api.get("/admin/precheck")
    assert status == 200 and body == {
        "results": [],
        "summary": {"pass": 0, "warn": 0, "fail": 0, "info": 0},
        "exit_code": 0,
    }
    # What the daemon does at start: the real pre-flight on this machine, composed into the
    # services of the daemon that starts with it.
    results = preflight(api.cfg)
    app = build_app(
        api.cfg, lambda: FakeEngine(token_delay_s=0.001), WordTokenizer(), prechecks=results
    )
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/admin/precheck", headers={"Authorization": f"Bearer {api.token}"})
        status, body = r.status, await r.json()
    assert status == 200
    assert body["results"] == [r.to_dict() for r in results]
    assert body["exit_code"] == exit_code(results)
    assert sum(body["summary"].values()) == len(results)
    by_name = {r["name"]: r for r in body["results"]}
    assert "port" not in by_name and by_name["memory_plan"]["status"] == "pass"
    assert by_name["model"]["status"] == "pass" and "chat template" in by_name["model"]["detail"]
    assert by_name["torch"]["status"] in ("pass", "warn") and "torch " in by_name["torch"]["detail"]
