"""Async HTTP client for the daemon's admin API; the TUI's only way to reach the daemon."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TOKEN_PATH = Path("state") / "admin.token"
TOKEN_ENV = "APPLIANCE_ADMIN_TOKEN"
TOKEN_HELP = (
    "the admin token lives in $APPLIANCE_ADMIN_TOKEN or in the file admin.token in the "
    "daemon's state directory (./state/admin.token from the repo, /var/lib/appliance/admin.token "
    "under systemd); pass it with --token-file PATH"
)


class AdminError(Exception):
    """A call to the admin API failed; `message` is fit to show an operator."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class DaemonDown(AdminError):
    """The daemon did not answer at all (refused, reset, timed out)."""


class Unauthorized(AdminError):
    """401: the token is missing or wrong."""


class NotAvailable(AdminError):
    """404 from an endpoint this daemon does not have (yet)."""


@dataclass(frozen=True)
class Token:
    """The admin token and where it came from (for messages)."""

    value: str | None
    source: str


def resolve_token(token_file: str | os.PathLike[str] | None = None) -> Token:
    """--token-file, else $APPLIANCE_ADMIN_TOKEN, else ./state/admin.token; value None if none."""
    if token_file:
        path = Path(token_file)
        try:
            return Token(path.read_text().strip() or None, f"--token-file {path}")
        except OSError as exc:
            return Token(None, f"--token-file {path} ({exc.strerror})")
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        return Token(env, f"${TOKEN_ENV}")
    try:
        return Token(DEFAULT_TOKEN_PATH.read_text().strip() or None, str(DEFAULT_TOKEN_PATH))
    except OSError as exc:
        return Token(None, f"{DEFAULT_TOKEN_PATH} ({exc.strerror})")


class AdminApi(Protocol):
    """What the TUI needs from the daemon; AdminClient is the one real implementation."""

    url: str

    async def status(self) -> dict[str, Any]: ...
    async def metrics_text(self) -> str: ...
    def events(self, history: int = 50) -> AsyncIterator[dict[str, Any]]: ...
    async def engine(self, action: str) -> dict[str, Any]: ...
    async def set_controller(self, **fields: Any) -> dict[str, Any]: ...
    async def jobs(self) -> dict[str, Any]: ...
    async def run_job(self, name: str) -> dict[str, Any]: ...
    async def benchmarks(self) -> dict[str, Any]: ...
    async def inject_fault(self, body: dict[str, Any]) -> dict[str, Any]: ...
    async def clear_faults(self) -> dict[str, Any]: ...
    async def close(self) -> None: ...


def _error_message(status: int, body: Any, fallback: str) -> tuple[str, str | None]:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        return str(err.get("message") or fallback), err.get("code")
    return fallback, None


class AdminClient:
    """aiohttp client for /admin/*; every failure becomes an AdminError subclass."""

    ENGINE_ACTIONS = ("restart", "pause", "resume")

    def __init__(self, url: str, token: Token, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token.value}"} if self.token.value else {}

    def _sess(self) -> aiohttp.ClientSession:
        # Created lazily: a ClientSession must be made inside the running event loop.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()

    def _raise_for(self, what: str, status: int, body: Any) -> None:
        msg, code = _error_message(status, body, f"HTTP {status}")
        if status == 401:
            if self.token.value is None:
                head = f"no admin token found ({self.token.source})"
            else:
                head = f"the daemon rejected the admin token from {self.token.source}"
            raise Unauthorized(f"{head}: {TOKEN_HELP}", status, code)
        if status == 404:
            raise NotAvailable(f"{what}: not available on this daemon", status, code)
        raise AdminError(f"{what}: {msg} (HTTP {status})", status, code)

    async def _call(
        self, method: str, path: str, what: str, json_body: Any = None, params: Any = None
    ) -> dict[str, Any]:
        try:
            async with self._sess().request(
                method,
                self.url + path,
                json=json_body,
                params=params,
                headers=self._headers(),
                timeout=self._timeout,
            ) as resp:
                text = await resp.text()
                try:
                    body: Any = json.loads(text) if text else {}
                except ValueError:
                    body = {"raw": text}
                if resp.status >= 400:
                    self._raise_for(what, resp.status, body)
                return body if isinstance(body, dict) else {"items": body}
        except AdminError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise DaemonDown(f"daemon at {self.url} unreachable: {_describe(exc)}") from None

    async def status(self) -> dict[str, Any]:
        """GET /admin/status: the whole snapshot."""
        return await self._call("GET", "/admin/status", "status")

    async def metrics_text(self) -> str:
        """GET /metrics as Prometheus text (no auth needed)."""
        try:
            async with self._sess().get(self.url + "/metrics", timeout=self._timeout) as resp:
                if resp.status >= 400:
                    self._raise_for("metrics", resp.status, {})
                return await resp.text()
        except AdminError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise DaemonDown(f"daemon at {self.url} unreachable: {_describe(exc)}") from None

    async def events(self, history: int = 50) -> AsyncIterator[dict[str, Any]]:
        """GET /admin/events (SSE): yield each event's JSON until the stream ends."""
        # No total timeout: the stream is open-ended; the daemon sends keep-alives every 15 s,
        # so 45 s of silence means the connection is dead.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=45)
        try:
            async with self._sess().get(
                self.url + "/admin/events",
                params={"history": str(history)},
                headers=self._headers(),
                timeout=timeout,
            ) as resp:
                if resp.status >= 400:
                    try:
                        body = await resp.json(content_type=None)
                    except ValueError:
                        body = {}
                    self._raise_for("events", resp.status, body)
                async for event in parse_sse(resp.content):
                    yield event
        except AdminError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise DaemonDown(f"event stream from {self.url} lost: {_describe(exc)}") from None

    async def engine(self, action: str) -> dict[str, Any]:
        """POST /admin/engine/{restart,pause,resume}."""
        if action not in self.ENGINE_ACTIONS:
            raise ValueError(f"action: one of {', '.join(self.ENGINE_ACTIONS)}, got {action!r}")
        return await self._call("POST", f"/admin/engine/{action}", f"engine {action}")

    async def set_controller(self, **fields: Any) -> dict[str, Any]:
        """PUT /admin/controller with any of mode, limit, min, max."""
        body = {k: v for k, v in fields.items() if v is not None}
        return await self._call("PUT", "/admin/controller", "controller", json_body=body)

    async def jobs(self) -> dict[str, Any]:
        """GET /admin/jobs."""
        return await self._call("GET", "/admin/jobs", "maintenance jobs")

    async def run_job(self, name: str) -> dict[str, Any]:
        """POST /admin/jobs/{name}/run."""
        return await self._call("POST", f"/admin/jobs/{name}/run", f"job {name}")

    async def benchmarks(self) -> dict[str, Any]:
        """GET /admin/benchmarks."""
        return await self._call("GET", "/admin/benchmarks", "benchmarks")

    async def inject_fault(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /admin/telemetry/faults (simulated GPU only)."""
        return await self._call("POST", "/admin/telemetry/faults", "fault", json_body=body)

    async def clear_faults(self) -> dict[str, Any]:
        """DELETE /admin/telemetry/faults."""
        return await self._call("DELETE", "/admin/telemetry/faults", "faults")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc) or type(exc).__name__
    return text.split(" [")[0] if "Cannot connect" in text else text


async def parse_sse(lines: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """Turn SSE lines (id:, event:, data:, ': comment') into event dicts."""
    data: list[str] = []
    kind: str | None = None
    async for raw in lines:
        line = raw.decode(errors="replace").rstrip("\r\n")
        if not line:
            if data:
                try:
                    event = json.loads("\n".join(data))
                except ValueError:
                    event = {"kind": kind or "message", "reason": "\n".join(data)}
                if isinstance(event, dict):
                    event.setdefault("kind", kind or "message")
                    yield event
            data, kind = [], None
        elif line.startswith(":"):
            continue  # keep-alive comment
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line.startswith("event:"):
            kind = line[6:].strip()
