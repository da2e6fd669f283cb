"""The fake-engine app harness shared by the integration tests (a module may override `h`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from appliance.daemon.app import build_app
from tests.fakes import FakeEngine, WordTokenizer
from tests.integration.test_app_fake_engine import Harness, _cfg


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    engines: list[FakeEngine] = []

    def factory() -> FakeEngine:
        engines.append(FakeEngine(token_delay_s=0.005, start_delay_s=0.05, max_model_len=64))
        return engines[-1]

    app = build_app(_cfg(tmp_path), factory, WordTokenizer())
    client = TestClient(TestServer(app))
    await client.start_server()
    token = (tmp_path / "admin.token").read_text().strip()
    harness = Harness(client, engines, token)
    await harness.wait_ready()
    yield harness
    await client.close()
