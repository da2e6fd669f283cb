"""How everything outside the daemon talks to it: finding it, its admin API, its event streams.

One client for the CLI, the TUI, the benches, the maintenance re-benchmark and the tests:
`address` finds the daemon's URL and admin token from the config the daemon reads,
`admin` makes the /admin/* calls (async, with a thin sync wrapper), `sse` reads
server-sent events.
"""

from appliance.client.address import (
    TOKEN_ENV,
    TOKEN_HELP,
    URL_ENV,
    DaemonAddress,
    Token,
    add_daemon_arguments,
    address_from_args,
    config_url,
    daemon_address,
    find_daemon,
    read_token_file,
)
from appliance.client.admin import (
    AdminClient,
    AdminError,
    DaemonDown,
    NotAvailable,
    SyncAdminClient,
    Unauthorized,
)
from appliance.client.sse import DONE, SseError, SseEvent, SseParser, aiter_sse, iter_sse, parse_sse

__all__ = [
    "DONE",
    "TOKEN_ENV",
    "TOKEN_HELP",
    "URL_ENV",
    "AdminClient",
    "AdminError",
    "DaemonAddress",
    "DaemonDown",
    "NotAvailable",
    "SseError",
    "SseEvent",
    "SseParser",
    "SyncAdminClient",
    "Token",
    "Unauthorized",
    "add_daemon_arguments",
    "address_from_args",
    "aiter_sse",
    "config_url",
    "daemon_address",
    "find_daemon",
    "iter_sse",
    "parse_sse",
    "read_token_file",
]
