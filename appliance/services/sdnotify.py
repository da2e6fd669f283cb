"""systemd's sd_notify protocol: READY, STATUS, STOPPING and watchdog pings over $NOTIFY_SOCKET.

The protocol is one datagram of newline-separated KEY=value lines to the AF_UNIX socket named
by $NOTIFY_SOCKET ('@' starts an abstract-namespace name). Outside systemd every call is a
no-op, and a failure to send is logged once and never raised: telling systemd is best effort,
serving requests is not.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("appliance.sdnotify")


def _address(name: str) -> str:
    """The sendto() address for a $NOTIFY_SOCKET value; '@' means the abstract namespace."""
    return "\0" + name[1:] if name.startswith("@") else name


def _watchdog_interval_s(environ: Mapping[str, str], pid: int) -> float | None:
    """WatchdogSec in seconds when the watchdog is meant for this process, else None."""
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    # A child that inherited the environment must not ping on its parent's behalf.
    owner = environ.get("WATCHDOG_PID")
    if owner and owner.strip() != str(pid):
        return None
    return usec / 1_000_000


class SdNotifier:
    """Sends sd_notify messages; every method is a no-op without $NOTIFY_SOCKET."""

    def __init__(self, socket_name: str | None, watchdog_interval_s: float | None = None) -> None:
        self.socket_name = socket_name or None
        # WatchdogSec: systemd acts when no ping came for this long.
        self.watchdog_interval_s = watchdog_interval_s if self.socket_name else None
        self.sent = 0
        self.failures = 0
        self._sock: socket.socket | None = None

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, pid: int | None = None
    ) -> SdNotifier:
        """Build from $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID."""
        env = os.environ if environ is None else environ
        return cls(
            env.get("NOTIFY_SOCKET"),
            _watchdog_interval_s(env, os.getpid() if pid is None else pid),
        )

    @property
    def enabled(self) -> bool:
        """True when a service manager listens."""
        return self.socket_name is not None

    def notify(self, **fields: object) -> bool:
        """Send KEY=value lines (keys upper-cased); True when the datagram went out."""
        if self.socket_name is None or not fields:
            return False
        # A newline inside a value would start a bogus field.
        lines = [f"{k.upper()}={str(v).replace(chr(10), ' ')}" for k, v in fields.items()]
        payload = "\n".join(lines).encode()
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                # Never block the event loop: a full receive queue drops the message instead.
                sock.setblocking(False)
                self._sock = sock
            self._sock.sendto(payload, _address(self.socket_name))
        except OSError as exc:
            self.failures += 1
            if self.failures == 1:
                log.warning(
                    "sd_notify to %s failed: %s (further failures are not logged)",
                    self.socket_name,
                    exc,
                    extra={"event": "sd_notify_failed", "reason": str(exc)},
                )
            return False
        self.sent += 1
        return True

    def ready(self, status: str | None = None) -> bool:
        """READY=1: start-up finished (the engine admits requests)."""
        if status is None:
            return self.notify(READY=1)
        return self.notify(READY=1, STATUS=status)

    def status(self, text: str) -> bool:
        """STATUS=text: one line shown by `systemctl status`."""
        return self.notify(STATUS=text)

    def stopping(self, status: str | None = None) -> bool:
        """STOPPING=1: shutdown began (SIGTERM, draining)."""
        if status is None:
            return self.notify(STOPPING=1)
        return self.notify(STOPPING=1, STATUS=status)

    def watchdog(self) -> bool:
        """WATCHDOG=1: the keep-alive ping."""
        return self.notify(WATCHDOG=1)

    def extend_timeout(self, seconds: float) -> bool:
        """EXTEND_TIMEOUT_USEC: ask for more start or stop time from now on."""
        return self.notify(EXTEND_TIMEOUT_USEC=int(seconds * 1_000_000))

    def close(self) -> None:
        """Close the socket (a later message opens a new one)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


async def watchdog_loop(notifier: SdNotifier) -> None:
    """Ping WATCHDOG=1 every WatchdogSec/2 from the event loop until cancelled.

    Runs on the loop on purpose: when the loop stalls the pings stop and systemd restarts the
    daemon. Returns at once when no watchdog is configured for this process.
    """
    interval = notifier.watchdog_interval_s
    if interval is None:
        return
    period = interval / 2
    while True:
        notifier.watchdog()
        await asyncio.sleep(period)
