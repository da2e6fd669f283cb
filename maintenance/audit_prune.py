"""The audit log's retention: delete the records older than audit.retention_days."""

from __future__ import annotations

import asyncio
from typing import Any

from appliance.services.audit_log import AuditLog


async def prune_audit(audit: AuditLog, now_s: float | None = None) -> dict[str, Any]:
    """Delete the records past retention (in a thread: SQLite blocks); the job's details."""
    deleted = await asyncio.to_thread(audit.prune, now_s)
    return {
        "deleted": deleted,
        "retention_days": audit.settings.retention_days,
        "audit_dropped_total": audit.dropped_total,
    }
