"""Where the daemon listens and which admin token it takes, found the way the daemon finds them.

Flags win, then the environment ($APPLIANCE_URL, $APPLIANCE_ADMIN_TOKEN), then the daemon's
own config, searched in the daemon's order (--config, $APPLIANCE_CONFIG,
/etc/appliance/config.yaml, ./config.yaml): its server.host/port give the URL and
state_dir/server.admin_token_file the token. So on a systemd install (state in
/var/lib/appliance) every client finds both with no flags.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from appliance.config import Config

URL_ENV = "APPLIANCE_URL"
TOKEN_ENV = "APPLIANCE_ADMIN_TOKEN"
TOKEN_HELP = (
    "the admin token lives in $APPLIANCE_ADMIN_TOKEN or in the file admin.token in the "
    "daemon's state directory (./state/admin.token from the repo, "
    "/var/lib/appliance/admin.token under systemd); pass it with --token-file PATH"
)
# A daemon bound to every address still answers on the loopback.
_ANY_HOST = ("0.0.0.0", "::", "")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Token:
    """The admin token (None when none was found) and where it came from, for messages."""

    value: str | None
    source: str  # "--token-file PATH", "$APPLIANCE_ADMIN_TOKEN", a file path, ...
    path: Path | None = None  # the file it is read from, so a client can read it again
    problem: str | None = None  # why there is no value

    @property
    def where(self) -> str:
        """The source, with the reason when no token came from it."""
        return f"{self.source} ({self.problem})" if self.problem else self.source

    def reread(self) -> Token:
        """Read the file again (the daemon writes it at its first start); else self."""
        if self.path is None:
            return self
        return read_token_file(self.path, self.source)


@dataclass(frozen=True)
class DaemonAddress:
    """A daemon's base URL and the admin token to send it."""

    url: str
    token: Token


def read_token_file(path: str | os.PathLike[str], source: str | None = None) -> Token:
    """The token in a file; value None, with the reason, when it cannot be read or is empty."""
    p = Path(path)
    label = source or str(p)
    try:
        value = p.read_text(encoding="utf-8").strip()
    except OSError as exc:
        return Token(None, label, p, exc.strerror or str(exc))
    return Token(value, label, p) if value else Token(None, label, p, "empty")


def config_url(cfg: Config) -> str:
    """The URL a daemon running with this config answers on."""
    host = "127.0.0.1" if cfg.server.host in _ANY_HOST else cfg.server.host
    if ":" in host:  # an IPv6 literal goes in brackets
        host = f"[{host}]"
    return f"http://{host}:{cfg.server.port}"


def _given_token(token_file: str | os.PathLike[str] | None) -> Token | None:
    if token_file:
        return read_token_file(token_file, f"--token-file {token_file}")
    env = os.environ.get(TOKEN_ENV, "").strip()
    return Token(env, f"${TOKEN_ENV}") if env else None


def _same_daemon(url: str, own: str) -> bool:
    a, b = urlsplit(url), urlsplit(own)
    if (a.scheme, a.port) != (b.scheme, b.port):
        return False
    return a.hostname == b.hostname or (a.hostname in _LOOPBACK and b.hostname in _LOOPBACK)


def daemon_address(
    cfg: Config, url: str | None = None, token_file: str | os.PathLike[str] | None = None
) -> DaemonAddress:
    """The address from a loaded config; the flags and the environment still win."""
    own = config_url(cfg)
    url = (url or os.environ.get(URL_ENV) or own).rstrip("/")
    token = _given_token(token_file)
    if token is None:
        path = Path(cfg.state_dir) / cfg.server.admin_token_file
        if _same_daemon(url, own):
            token = read_token_file(path)
        else:
            # The configured daemon's token is never sent to another endpoint.
            token = Token(None, str(path), None, f"not sent to {url}: it is {own}'s token")
    return DaemonAddress(url, token)


def find_daemon(
    config: str | os.PathLike[str] | None = None,
    url: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
) -> DaemonAddress:
    """The address from flags, environment and the daemon's config (read only when needed).

    A config that is there but bad raises ConfigError, naming each bad key.
    """
    given_url = url or os.environ.get(URL_ENV)
    token = _given_token(token_file)
    if given_url and token is not None:
        return DaemonAddress(given_url.rstrip("/"), token)
    from appliance.config import find_config_path, load_config

    return daemon_address(load_config(find_config_path(config)), url, token_file)


def add_daemon_arguments(p: argparse.ArgumentParser, url_help: str = "daemon base URL") -> None:
    """--config, --url, --token-file: how a command finds the daemon."""
    p.add_argument(
        "--config",
        help="the daemon's config, for its URL and admin token (default: the daemon's own "
        "search order: $APPLIANCE_CONFIG, /etc/appliance/config.yaml, ./config.yaml)",
    )
    p.add_argument("--url", help=f"{url_help} (default ${URL_ENV}, then the config)")
    p.add_argument(
        "--token-file",
        help=f"admin token file (default ${TOKEN_ENV}, then admin.token in the config's "
        "state_dir)",
    )


def address_from_args(args: argparse.Namespace) -> DaemonAddress:
    """find_daemon with the arguments add_daemon_arguments defined."""
    return find_daemon(args.config, args.url, args.token_file)
