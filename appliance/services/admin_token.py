"""The admin bearer token: from the environment, or a 0600 file made at first start."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

ENV_VAR = "APPLIANCE_ADMIN_TOKEN"


def load_or_create_admin_token(path: Path) -> str:
    """$APPLIANCE_ADMIN_TOKEN wins; else read path, creating it (mode 0600) if missing."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return env
    with contextlib.suppress(FileNotFoundError):
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    # Mode set at creation: the token is never readable by others, not even briefly;
    # written to a temp file and renamed so a crash never leaves a half-written token.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return token
