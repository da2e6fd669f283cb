"""The connection banner: hidden while the daemon answers, loud when it does not."""

from __future__ import annotations

from textual.widgets import Static

from tui.view_state import Connection, Link


class ConnectionBanner(Static):
    """Says the daemon is down (and when we retry) or the token is wrong, and where it lives."""

    def show(self, conn: Connection, url: str) -> None:
        """Render the connection state."""
        self.set_class(conn.link is Link.DOWN, "-down")
        self.set_class(conn.link is Link.UNAUTHORIZED, "-auth")
        self.set_class(conn.link is Link.CONNECTING, "-connecting")
        if conn.link is Link.UP:
            self.display = False
            return
        self.display = True
        retry = f" - retrying in {conn.retry_in_s:.0f} s" if conn.retry_in_s else ""
        if conn.link is Link.DOWN:
            self.update(f"DAEMON DOWN: {conn.message}{retry}")
        elif conn.link is Link.UNAUTHORIZED:
            self.update(f"BAD ADMIN TOKEN: {conn.message}{retry}")
        else:
            self.update(f"connecting to {url} ...")
