"""The fake-engine app harness shared by the integration tests (a module may override `h`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.test_app_fake_engine import Harness, _cfg, running


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    monkeypatch.delenv("APPLIANCE_ADMIN_TOKEN", raising=False)
    async with running(_cfg(tmp_path), token_delay_s=0.005, start_delay_s=0.05) as harness:
        yield harness
