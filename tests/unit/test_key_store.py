"""The key store against real SQLite, and the daemon's registry (open mode, constant-time
check, revoke seen by a live registry through another connection to the same file)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from pathlib import Path

import pytest

from appliance.domain.api_keys import ANONYMOUS, KeySpec
from appliance.domain.lanes import Lane
from appliance.errors import Unauthorized
from appliance.services import key_store
from appliance.services.key_store import KeyExists, KeyRegistry, KeyStore
from appliance.services.store import StateStore


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state" / "appliance.db"


@pytest.fixture
def store(db: Path) -> KeyStore:
    return KeyStore(db)


def _bearer(secret: str) -> str:
    return f"Bearer {secret}"


def _file_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))


def test_secret_shape_and_hash_at_rest(store: KeyStore, db: Path):
    secret = store.add(KeySpec(name="alice", max_lane=Lane.INTERACTIVE, requests_per_min=60))
    assert secret.startswith("sk-app-") and len(secret) > 40
    # Neither the secret nor any long piece of it is in the file (its WAL included).
    raw = _file_bytes(db)
    assert secret.encode() not in raw
    assert secret[6:].encode() not in raw and secret[12:].encode() not in raw
    assert hashlib.sha256(secret.encode()).hexdigest().encode() in raw
    [info] = store.list()
    assert info.prefix == secret[:12] and info.revoked_s is None
    assert info.spec == KeySpec(name="alice", max_lane=Lane.INTERACTIVE, requests_per_min=60)
    assert abs(info.created_s - time.time()) < 5
    assert secret not in repr(info)


def test_spec_round_trips(store: KeyStore):
    spec = KeySpec(
        name="batch-bot",
        max_lane=Lane.BATCH,
        downgrade=True,
        requests_per_min=10,
        tokens_per_min=5000,
        concurrency_share=0.25,
        weight=7,
    )
    store.add(spec)
    assert [i.spec for i in store.list()] == [spec]


def test_duplicate_active_name_names_the_name(store: KeyStore):
    store.add(KeySpec(name="alice", max_lane=Lane.REALTIME))
    with pytest.raises(KeyExists, match="'alice'"):
        store.add(KeySpec(name="alice", max_lane=Lane.BATCH))
    assert len(store.list()) == 1
    # Once revoked, the name can be used again; the old key stays in the history.
    assert store.revoke("alice")
    store.add(KeySpec(name="alice", max_lane=Lane.BATCH))
    assert [i.spec.max_lane for i in store.list()] == [Lane.BATCH]
    assert len(store.list(include_revoked=True)) == 2


def test_revoke_and_version(store: KeyStore):
    v0 = store.version()
    store.add(KeySpec(name="alice", max_lane=Lane.REALTIME))
    v1 = store.version()
    assert v1 != v0
    assert store.revoke("alice") is True
    v2 = store.version()
    assert v2 != v1
    assert store.revoke("alice") is False  # no active key of that name any more
    assert store.revoke("nobody") is False
    assert store.version() == v2  # nothing changed
    assert store.list() == []
    [gone] = store.list(include_revoked=True)
    assert gone.revoked_s is not None and gone.revoked_s >= gone.created_s


def test_shares_the_file_with_the_state_store(db: Path):
    state = StateStore(db)
    keys = KeyStore(db)
    v = keys.version()
    state.add_event(time.time(), "test", "a write to another table", {})
    assert keys.version() == v  # the state store's writes are not key changes
    keys.add(KeySpec(name="alice", max_lane=Lane.REALTIME))
    assert KeyStore(db).list()[0].spec.name == "alice"


# --- the registry ----------------------------------------------------------------------------


def test_open_mode_without_keys(store: KeyStore):
    reg = KeyRegistry(store)
    assert reg.open
    assert reg.authenticate(None) is ANONYMOUS
    assert reg.authenticate("Bearer anything") is ANONYMOUS


def test_authenticate(store: KeyStore):
    secret = store.add(KeySpec(name="alice", max_lane=Lane.INTERACTIVE))
    other = store.add(KeySpec(name="bob", max_lane=Lane.BATCH))
    reg = KeyRegistry(store)
    assert not reg.open
    assert reg.authenticate(_bearer(secret)).name == "alice"
    assert reg.authenticate(f"bearer  {other} ").name == "bob"
    for header in (None, "", "Bearer", "Bearer ", "Basic abc", secret, _bearer(secret + "x")):
        with pytest.raises(Unauthorized) as err:
            reg.authenticate(header)
        assert err.value.status == 401
        assert secret not in err.value.message and secret[12:] not in err.value.message


def test_every_key_is_compared_without_early_exit(store: KeyStore, monkeypatch: pytest.MonkeyPatch):
    first = store.add(KeySpec(name="a", max_lane=Lane.REALTIME))
    for name in "bcd":
        store.add(KeySpec(name=name, max_lane=Lane.REALTIME))
    reg = KeyRegistry(store, legacy_keys=("legacy-secret",))
    calls: list[tuple[str, str]] = []
    compare = hmac.compare_digest

    def counting(a: str, b: str) -> bool:
        calls.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(key_store.hmac, "compare_digest", counting)
    assert reg.authenticate(_bearer(first)).name == "a"
    assert len(calls) == 5  # a match on the first key still compares all five
    assert all(len(a) == 64 and len(b) == 64 for a, b in calls)  # digests, never secrets
    calls.clear()
    with pytest.raises(Unauthorized):
        reg.authenticate("Bearer wrong")
    assert len(calls) == 5


def test_legacy_config_keys_are_principals(store: KeyStore):
    reg = KeyRegistry(store, legacy_keys=("one", "two"))
    assert not reg.open
    spec = reg.authenticate("Bearer two")
    assert spec == KeySpec(name="config-2", max_lane=Lane.REALTIME)
    secret = store.add(KeySpec(name="alice", max_lane=Lane.BATCH))
    reg.refresh()
    assert reg.authenticate(_bearer(secret)).name == "alice"
    assert reg.authenticate("Bearer one").name == "config-1"
    assert [k.name for k in reg.keys] == ["config-1", "config-2", "alice"]


def test_revoked_key_refused_after_refresh(store: KeyStore, db: Path):
    secret = store.add(KeySpec(name="alice", max_lane=Lane.REALTIME))
    keep = store.add(KeySpec(name="bob", max_lane=Lane.REALTIME))
    reg = KeyRegistry(store)
    assert reg.refresh() is False  # nothing changed since it loaded
    assert KeyStore(db).revoke("alice")  # another connection, as the CLI is
    assert reg.authenticate(_bearer(secret)).name == "alice"  # the snapshot, until refresh
    assert reg.refresh() is True
    with pytest.raises(Unauthorized):
        reg.authenticate(_bearer(secret))
    assert reg.authenticate(_bearer(keep)).name == "bob"
    # Revoking the last key does not open the box: the revoked key still gets a 401.
    KeyStore(db).revoke("bob")
    assert reg.refresh()
    assert not reg.open and reg.keys == ()
    for header in (None, _bearer(keep)):
        with pytest.raises(Unauthorized):
            reg.authenticate(header)


async def test_watch_sees_another_connections_revoke_within_a_second(db: Path):
    daemon_store = KeyStore(db)
    cli_store = KeyStore(db)  # another process in reality: its own connection to the file
    secret = cli_store.add(KeySpec(name="alice", max_lane=Lane.REALTIME))
    reg = KeyRegistry(daemon_store)
    watcher = asyncio.create_task(reg.watch(interval_s=0.25))
    try:
        assert reg.authenticate(_bearer(secret)).name == "alice"
        assert cli_store.revoke("alice")
        revoked_at = time.monotonic()
        while True:
            try:
                reg.authenticate(_bearer(secret))
            except Unauthorized:
                break
            assert time.monotonic() - revoked_at < 1.0, "revoked key still served after 1 s"
            await asyncio.sleep(0.02)
        # A key added meanwhile is taken up the same way.
        new = cli_store.add(KeySpec(name="bob", max_lane=Lane.BATCH))
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                assert reg.authenticate(_bearer(new)).name == "bob"
                break
            except Unauthorized:
                await asyncio.sleep(0.02)
        else:
            pytest.fail("new key not accepted within 1 s")
    finally:
        watcher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watcher


def test_purging_the_revoked_keys_opens_the_registry_again(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "appliance.db")
    store.add(KeySpec("a", Lane.BATCH))
    keep = store.add(KeySpec("b", Lane.BATCH))
    registry = KeyRegistry(store)
    assert store.revoke("a") and store.purge_revoked() == 1
    registry.refresh()
    assert not registry.open and registry.authenticate(f"Bearer {keep}").name == "b"
    assert store.revoke("b")
    registry.refresh()
    assert not registry.open  # revoked, not forgotten: still a closed box
    assert store.purge_revoked() == 1 and store.purge_revoked() == 0
    registry.refresh()
    assert registry.open and registry.authenticate(None).name == "anonymous"
