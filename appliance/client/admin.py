"""The daemon's admin API (/admin/*): one aiohttp client, and a thin wrapper for sync code.

Every call sends `Authorization: Bearer TOKEN` and decodes JSON; every failure is an
AdminError whose message is fit to show an operator: a 401 names where the token came from
and where it should be, an unreachable daemon names the URL.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import aiohttp

from appliance.client.address import TOKEN_HELP, DaemonAddress, Token
from appliance.client.sse import SseError, SseEvent, aiter_sse

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 10.0
# The daemon sends a keep-alive every 15 s on its event stream: 45 s of silence is a dead link.
STREAM_SILENCE_S = 45.0


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
    """404: this daemon has no such endpoint or thing (an unknown job, an older daemon)."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc) or type(exc).__name__
    # aiohttp repeats the address and the OS error in brackets; the URL is named already.
    return text.split(" [")[0] if "Cannot connect" in text else text


def _decode(text: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {"raw": text}


class AdminClient:
    """aiohttp client for /admin/*; make it inside the event loop that uses it."""

    ENGINE_ACTIONS = ("restart", "pause", "resume")

    def __init__(
        self,
        url: str,
        token: Token,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session = session
        self._owns_session = session is None

    @classmethod
    def at(cls, address: DaemonAddress, **kwargs: Any) -> AdminClient:
        """A client for a found daemon."""
        return cls(address.url, address.token, **kwargs)

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session (one given to the constructor stays open)."""
        if self._owns_session and self._session is not None:
            await self._session.close()

    def _sess(self) -> aiohttp.ClientSession:
        # Made lazily: a ClientSession belongs to the loop running when it is made.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token.value}"} if self.token.value else {}

    def _token_changed(self) -> bool:
        """Read a file token again after a 401: the daemon may have (re)written it."""
        fresh = self.token.reread()
        if fresh.value is None or fresh.value == self.token.value:
            return False
        self.token = fresh
        return True

    def _raise_for(self, what: str, status: int, body: Any) -> None:
        err = body.get("error") if isinstance(body, dict) else None
        msg = str(err.get("message") or "") if isinstance(err, dict) else ""
        code = err.get("code") if isinstance(err, dict) else None
        if status == 401:
            if self.token.value is None:
                head = f"no admin token found ({self.token.where})"
            else:
                head = f"the daemon at {self.url} rejected the admin token from {self.token.where}"
            raise Unauthorized(f"{head}: {TOKEN_HELP}", status, code)
        text = f"{what}: {msg or 'HTTP ' + str(status)} (HTTP {status})"
        raise (NotAvailable if status == 404 else AdminError)(text, status, code)

    def _down(self, exc: BaseException) -> DaemonDown:
        return DaemonDown(f"daemon at {self.url} unreachable: {_describe(exc)}")

    async def _send(
        self, method: str, path: str, body: Any, params: dict[str, str] | None
    ) -> tuple[int, Any]:
        async with self._sess().request(
            method,
            self.url + path,
            json=body,
            params=params,
            headers=self._headers(),
            timeout=self._timeout,
        ) as resp:
            return resp.status, _decode(await resp.text())

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        what: str | None = None,
    ) -> dict[str, Any]:
        """One call: JSON body in, the decoded JSON answer out (a list comes as {"items"})."""
        what = what or f"{method} {path}"
        if self.token.value is None:
            self.token = self.token.reread()
        try:
            status, doc = await self._send(method, path, body, params)
            if status == 401 and self._token_changed():
                status, doc = await self._send(method, path, body, params)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise self._down(exc) from None
        if status >= 400:
            self._raise_for(what, status, doc)
        return doc if isinstance(doc, dict) else {"items": doc}

    async def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        """GET path."""
        return await self.request("GET", path, params=params)

    async def post(
        self, path: str, body: Any = None, params: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """POST path with an optional JSON body."""
        return await self.request("POST", path, body, params)

    async def put(self, path: str, body: Any) -> dict[str, Any]:
        """PUT path with a JSON body."""
        return await self.request("PUT", path, body)

    async def delete(self, path: str) -> dict[str, Any]:
        """DELETE path."""
        return await self.request("DELETE", path)

    async def text(self, path: str) -> str:
        """GET a plain-text endpoint (e.g. /metrics)."""
        try:
            async with self._sess().get(
                self.url + path, headers=self._headers(), timeout=self._timeout
            ) as resp:
                body = await resp.text()
                if resp.status >= 400:
                    self._raise_for(f"GET {path}", resp.status, _decode(body))
                return body
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise self._down(exc) from None

    async def stream(
        self, path: str, params: dict[str, str] | None = None, what: str | None = None
    ) -> AsyncIterator[SseEvent]:
        """GET an SSE endpoint; yield its events until the daemon ends the stream."""
        what = what or f"GET {path}"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=STREAM_SILENCE_S)
        if self.token.value is None:
            self.token = self.token.reread()
        try:
            for attempt in (1, 2):
                async with self._sess().get(
                    self.url + path, params=params, headers=self._headers(), timeout=timeout
                ) as resp:
                    if resp.status == 401 and attempt == 1 and self._token_changed():
                        continue
                    if resp.status >= 400:
                        self._raise_for(what, resp.status, _decode(await resp.text()))
                    async for event in aiter_sse(resp.content):
                        yield event
                    return
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise DaemonDown(f"{what} from {self.url} lost: {_describe(exc)}") from None

    # -- the admin API by name ------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        """GET /admin/status: the whole snapshot."""
        return await self.request("GET", "/admin/status", what="status")

    async def metrics_text(self) -> str:
        """GET /metrics as Prometheus text."""
        return await self.text("/metrics")

    async def events(self, history: int = 50) -> AsyncIterator[dict[str, Any]]:
        """GET /admin/events: each event's JSON, its `kind` the SSE event name if absent."""
        params = {"history": str(history)}
        async for event in self.stream("/admin/events", params, what="events"):
            try:
                doc = event.json()
            except SseError:
                doc = {"reason": event.data}
            if isinstance(doc, dict):
                doc.setdefault("kind", event.event)
                yield doc

    async def engine(self, action: str) -> dict[str, Any]:
        """POST /admin/engine/{restart,pause,resume}."""
        if action not in self.ENGINE_ACTIONS:
            raise ValueError(f"action: one of {', '.join(self.ENGINE_ACTIONS)}, got {action!r}")
        return await self.request("POST", f"/admin/engine/{action}", what=f"engine {action}")

    async def set_controller(self, **fields: Any) -> dict[str, Any]:
        """PUT /admin/controller with any of mode, limit, min, max (None: left as is)."""
        body = {k: v for k, v in fields.items() if v is not None}
        return await self.request("PUT", "/admin/controller", body, what="controller")

    async def jobs(self) -> dict[str, Any]:
        """GET /admin/jobs."""
        return await self.request("GET", "/admin/jobs", what="maintenance jobs")

    async def run_job(self, name: str, force: bool = False) -> dict[str, Any]:
        """POST /admin/jobs/{name}/run; force skips the job's load guard."""
        params = {"force": "1"} if force else None
        return await self.request("POST", f"/admin/jobs/{name}/run", None, params, f"job {name}")

    async def benchmarks(self) -> dict[str, Any]:
        """GET /admin/benchmarks."""
        return await self.request("GET", "/admin/benchmarks", what="benchmarks")

    async def record_benchmark(
        self, report: dict[str, Any], apply: bool, objective: str = "knee"
    ) -> dict[str, Any]:
        """POST /admin/benchmarks; with apply the level objective picks (knee, score or a
        level on the Pareto front) becomes the ceiling."""
        params = {"apply": "1", "objective": objective} if apply else None
        return await self.request("POST", "/admin/benchmarks", report, params, "store benchmark")

    async def apply_benchmark(self, bench_id: int, objective: dict[str, Any]) -> dict[str, Any]:
        """POST /admin/benchmarks/{id}/apply: the run's objective becomes the ceiling."""
        return await self.request(
            "POST", f"/admin/benchmarks/{bench_id}/apply", objective, what="apply benchmark"
        )

    async def thresholds(self) -> dict[str, Any]:
        """GET /admin/thresholds: the set in force and the earlier ones."""
        return await self.request("GET", "/admin/thresholds", what="thresholds")

    async def rollback_thresholds(self) -> dict[str, Any]:
        """POST /admin/thresholds/rollback."""
        return await self.request("POST", "/admin/thresholds/rollback", what="thresholds rollback")

    async def usage(self, from_day: str | None = None, to_day: str | None = None) -> dict[str, Any]:
        """GET /admin/usage: requests and tokens per key over UTC days (default: a week)."""
        params = {k: v for k, v in (("from", from_day), ("to", to_day)) if v}
        return await self.request("GET", "/admin/usage", None, params or None, "usage")

    async def keys(self) -> dict[str, Any]:
        """GET /admin/keys: the active keys and what each runs and queues now."""
        return await self.request("GET", "/admin/keys", what="keys")

    async def inject_fault(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /admin/telemetry/faults (simulated GPU only)."""
        return await self.request("POST", "/admin/telemetry/faults", body, what="fault")

    async def clear_faults(self) -> dict[str, Any]:
        """DELETE /admin/telemetry/faults."""
        return await self.request("DELETE", "/admin/telemetry/faults", what="faults")


def _run_sync(make: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await make()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    # A sync caller inside a running loop (a helper in async code) cannot re-enter it: the
    # call gets a private loop on a worker thread, and this thread waits, as urllib would.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="admin-call") as pool:
        return pool.submit(asyncio.run, main()).result()


class SyncAdminClient:
    """AdminClient for code without an event loop (the CLI, threads): one short loop a call."""

    def __init__(self, url: str, token: Token, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    @classmethod
    def at(cls, address: DaemonAddress, **kwargs: Any) -> SyncAdminClient:
        """A client for a found daemon."""
        return cls(address.url, address.token, **kwargs)

    def run(self, call: Callable[[AdminClient], Awaitable[T]]) -> T:
        """Run call(AdminClient) to the end, e.g. `run(lambda c: c.jobs())`."""

        async def once() -> T:
            async with AdminClient(self.url, self.token, self.timeout_s) as client:
                try:
                    return await call(client)
                finally:
                    self.token = client.token  # a token read again stays read

        return _run_sync(once)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """AdminClient.request, synchronously."""
        return self.run(lambda c: c.request(method, path, body, params))

    def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        """GET path."""
        return self.request("GET", path, params=params)

    def post(
        self, path: str, body: Any = None, params: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """POST path with an optional JSON body."""
        return self.request("POST", path, body, params)

    def put(self, path: str, body: Any) -> dict[str, Any]:
        """PUT path with a JSON body."""
        return self.request("PUT", path, body)

    def delete(self, path: str) -> dict[str, Any]:
        """DELETE path."""
        return self.request("DELETE", path)
