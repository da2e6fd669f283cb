"""sd_notify against a real unix datagram socket, as systemd would listen on it."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from appliance.services import sdnotify
from appliance.services.sdnotify import SdNotifier, watchdog_loop


@dataclass
class Listener:
    """A bound AF_UNIX datagram socket; a thread records every message."""

    sock: socket.socket
    name: str  # what NOTIFY_SOCKET holds
    received: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.sock.settimeout(0.05)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.received.append(data.decode())

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        self.sock.close()

    def messages(self, quiet_s: float = 0.06) -> list[str]:
        # Let the receiver thread drain the queue: wait until nothing arrived for quiet_s.
        deadline = time.monotonic() + 2
        seen = -1
        while len(self.received) != seen and time.monotonic() < deadline:
            seen = len(self.received)
            time.sleep(quiet_s)
        return list(self.received)


def _bound(address: str, name: str) -> Listener:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    listener = Listener(sock, name)
    listener.start()
    return listener


@pytest.fixture
def listener() -> Iterator[Listener]:
    # A short directory: AF_UNIX paths are limited to 108 bytes.
    with tempfile.TemporaryDirectory(prefix="sdn-") as d:
        path = os.path.join(d, "notify")
        lst = _bound(path, path)
        yield lst
        lst.stop()


def test_ready_status_stopping_arrive_in_order(listener: Listener) -> None:
    n = SdNotifier.from_env({"NOTIFY_SOCKET": listener.name})
    assert n.enabled
    assert n.ready()
    assert n.status("engine ready")
    assert n.status("restarting: manual")
    assert n.stopping()
    n.close()
    assert listener.messages() == [
        "READY=1",
        "STATUS=engine ready",
        "STATUS=restarting: manual",
        "STOPPING=1",
    ]


def test_fields_share_one_datagram_and_newlines_cannot_inject(listener: Listener) -> None:
    n = SdNotifier.from_env({"NOTIFY_SOCKET": listener.name})
    n.ready("ready: SmolLM2")
    n.status("line one\nWATCHDOG=trigger")
    n.notify(errno=5, status="failing")
    n.stopping("draining")
    n.close()
    assert listener.messages() == [
        "READY=1\nSTATUS=ready: SmolLM2",
        "STATUS=line one WATCHDOG=trigger",
        "ERRNO=5\nSTATUS=failing",
        "STOPPING=1\nSTATUS=draining",
    ]


def test_extend_timeout_is_in_microseconds(listener: Listener) -> None:
    n = SdNotifier.from_env({"NOTIFY_SOCKET": listener.name})
    n.extend_timeout(90)
    n.close()
    assert listener.messages() == ["EXTEND_TIMEOUT_USEC=90000000"]


def test_abstract_namespace_socket() -> None:
    name = f"@appliance-test-{os.getpid()}-{time.monotonic_ns()}"
    lst = _bound("\0" + name[1:], name)
    try:
        n = SdNotifier.from_env({"NOTIFY_SOCKET": name})
        assert n.ready()
        n.close()
        assert lst.messages() == ["READY=1"]
    finally:
        lst.stop()


def test_without_notify_socket_everything_is_a_noop() -> None:
    n = SdNotifier.from_env({"WATCHDOG_USEC": "1000000"})
    assert not n.enabled
    assert n.watchdog_interval_s is None
    assert not n.ready()
    assert not n.status("x")
    assert not n.stopping()
    assert not n.watchdog()
    assert n.sent == 0


def test_send_failure_is_logged_once_and_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    n = SdNotifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    with caplog.at_level(logging.WARNING, logger="appliance.sdnotify"):
        results = [n.ready(), n.status("a"), n.watchdog()]
    assert results == [False, False, False]
    assert n.failures == 3
    warnings = [r for r in caplog.records if r.name == "appliance.sdnotify"]
    assert len(warnings) == 1
    assert "nobody-listens" in warnings[0].getMessage()


@pytest.mark.parametrize(
    ("env", "pid", "expected"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 10, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "10"}, 10, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "11"}, 10, None),  # the parent's
        ({"WATCHDOG_USEC": "0"}, 10, None),
        ({"WATCHDOG_USEC": "soon"}, 10, None),
        ({}, 10, None),
    ],
)
def test_watchdog_interval_from_env(env: dict[str, str], pid: int, expected: float | None) -> None:
    n = SdNotifier.from_env({"NOTIFY_SOCKET": "/run/x", **env}, pid=pid)
    assert n.watchdog_interval_s == expected


async def test_watchdog_loop_returns_at_once_without_watchdog(listener: Listener) -> None:
    n = SdNotifier.from_env({"NOTIFY_SOCKET": listener.name})
    await asyncio.wait_for(watchdog_loop(n), timeout=1)
    assert listener.messages() == []


async def test_watchdog_pings_at_half_the_interval(
    listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    # WatchdogSec=0.4 s: the loop must ping first, then ask for 0.2 s between pings. The test
    # reads the schedule the loop asks for instead of counting pings in wall time, which a
    # loaded machine stretches; the pings themselves still go through the real socket.
    env = {"NOTIFY_SOCKET": listener.name, "WATCHDOG_USEC": "400000"}
    n = SdNotifier.from_env({**env, "WATCHDOG_PID": str(os.getpid())})
    asked: list[tuple[float, int]] = []  # (sleep requested, pings sent before it)

    class Enough(Exception):
        """Ends the endless loop after a few rounds, as a cancellation would."""

    async def fake_sleep(delay: float) -> None:
        asked.append((delay, n.sent))
        if len(asked) == 4:
            raise Enough

    # Only the module's view of asyncio: the test's own event loop keeps the real sleep.
    monkeypatch.setattr(sdnotify, "asyncio", SimpleNamespace(sleep=fake_sleep))
    with pytest.raises(Enough):
        await watchdog_loop(n)
    assert [delay for delay, _ in asked] == pytest.approx([0.2] * 4)
    assert [sent for _, sent in asked] == [1, 2, 3, 4], "one ping before every sleep"
    assert listener.messages() == ["WATCHDOG=1"] * 4


async def test_watchdog_pings_stop_while_the_loop_is_blocked(listener: Listener) -> None:
    # The watchdog must run on the event loop, not in a thread: a stalled loop must stop the
    # pings so systemd restarts the daemon. Counting pings at fixed points (before, during and
    # after a blocking call) says that without bounds on when datagrams arrive.
    n = SdNotifier.from_env({"NOTIFY_SOCKET": listener.name, "WATCHDOG_USEC": "200000"})
    task = asyncio.create_task(watchdog_loop(n))
    await asyncio.sleep(0.35)  # the first ping goes out as soon as the task runs
    before = n.sent
    assert before >= 1
    time.sleep(1.0)  # a stalled event loop: nothing else runs (WatchdogSec=0.2 s would fire)
    assert n.sent == before, "a blocked loop must not ping"
    await asyncio.sleep(0.35)  # the loop's overdue 0.1 s sleep ends on its first turn
    assert n.sent > before, "pings resume with the loop"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert listener.messages() == ["WATCHDOG=1"] * n.sent
