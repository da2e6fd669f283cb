"""The application key the handlers find the daemon's services under."""

from __future__ import annotations

from aiohttp import web

from appliance.services.container import Services

SERVICES = web.AppKey("services", Services)
