"""The one admin client against the real HTTP app (fake engine) over a real socket: the calls,
the failures an operator must be able to act on, the sync wrapper, the event stream."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from appliance.client import (
    AdminClient,
    AdminError,
    DaemonDown,
    NotAvailable,
    SyncAdminClient,
    Token,
    Unauthorized,
    read_token_file,
)
from bench.servers import free_port
from tests.integration.test_app_fake_engine import Harness


def _url(h: Harness) -> str:
    return str(h.client.make_url("")).rstrip("/")


async def test_json_calls_with_every_verb(h: Harness, tmp_path: Path) -> None:
    async with AdminClient(_url(h), read_token_file(tmp_path / "admin.token")) as admin:
        assert (await admin.status())["engine"]["state"] == "ready"
        await admin.set_controller(mode="manual", limit=1, min=None)
        assert h.svc.admission.snapshot().base_limit == 1
        fault = await admin.inject_fault({"name": "hot_room", "delta_c": 60})
        assert fault["faults"] and (await admin.clear_faults())["removed"] == 1
        assert "appliance_requests_in_flight" in await admin.metrics_text()
        assert {j["name"] for j in (await admin.jobs())["jobs"]} >= {"restart", "benchmark"}


async def test_a_wrong_token_names_its_source_and_where_the_right_one_is(h: Harness) -> None:
    async with AdminClient(_url(h), Token("wrong", "--token-file /tmp/x")) as admin:
        with pytest.raises(Unauthorized) as caught:
            await admin.status()
    msg = caught.value.message
    assert "rejected the admin token from --token-file /tmp/x" in msg
    assert "$APPLIANCE_ADMIN_TOKEN" in msg and "admin.token" in msg and "--token-file" in msg
    assert caught.value.status == 401


async def test_a_missing_token_says_which_file_was_tried(h: Harness, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "admin.token"
    async with AdminClient(_url(h), read_token_file(missing)) as admin:
        with pytest.raises(Unauthorized, match=r"no admin token found \(.*nowhere/admin.token"):
            await admin.jobs()


async def test_a_token_written_later_is_read_again(h: Harness, tmp_path: Path) -> None:
    later = tmp_path / "later.token"
    later.write_text("stale")
    async with AdminClient(_url(h), read_token_file(later)) as admin:
        with pytest.raises(Unauthorized):
            await admin.status()
        later.write_text(h.token)  # the daemon (re)wrote it: the next 401 reads it again
        assert (await admin.status())["engine"]["state"] == "ready"
        assert admin.token.value == h.token


async def test_errors_carry_the_daemons_message(h: Harness) -> None:
    async with AdminClient(_url(h), Token(h.token, "test")) as admin:
        with pytest.raises(NotAvailable, match=r"job nosuch: .*\(HTTP 404\)"):
            await admin.run_job("nosuch")
        with pytest.raises(AdminError, match=r"controller: mode: must be 'auto' or 'manual'"):
            await admin.set_controller(mode="fast")
        with pytest.raises(ValueError, match="action: one of restart, pause, resume"):
            await admin.engine("explode")


async def test_an_unreachable_daemon_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with AdminClient(url, Token("t", "test"), timeout_s=2) as admin:
        with pytest.raises(DaemonDown, match=f"daemon at {url} unreachable"):
            await admin.status()
    with pytest.raises(DaemonDown, match=f"daemon at {url} unreachable"):
        await asyncio.to_thread(SyncAdminClient(url, Token("t", "test"), 2).get, "/admin/status")


async def test_the_sync_wrapper_from_a_thread_and_from_inside_a_loop(h: Harness) -> None:
    sync = SyncAdminClient(_url(h), Token(h.token, "test"))
    assert (await asyncio.to_thread(sync.get, "/admin/status"))["engine"]["state"] == "ready"
    assert await asyncio.to_thread(sync.post, "/admin/engine/pause")
    assert h.svc.supervisor.state.value == "paused"
    # Called straight from async code (conftest's Daemon.status() is): no "asyncio.run()
    # cannot be called from a running event loop", the call runs on a private loop instead.
    # (Not against this in-loop app: a sync call blocks the loop that would answer it.)
    assert sync.run(lambda c: asyncio.sleep(0, result=c.url)) == _url(h)


async def test_events_come_as_dicts_with_their_kind(h: Harness) -> None:
    async with AdminClient(_url(h), Token(h.token, "test")) as admin:
        stream = admin.events(history=50)
        seen = []
        await admin.engine("pause")
        await admin.engine("resume")
        async for event in stream:
            if event["kind"] == "engine_state":
                seen.append(event["data"]["state"])
            if seen[-2:] == ["paused", "ready"]:
                break
        await stream.aclose()
    assert seen[:2] == ["starting", "ready"] and seen[-2:] == ["paused", "ready"]
