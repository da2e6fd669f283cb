"""The fair queue inside a lane: FIFO for one key, weighted turns between keys."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from appliance.domain.fair_queue import FairQueue


def drain(q: FairQueue[str]) -> list[str]:
    out = []
    while (item := q.pop()) is not None:
        out.append(item)
    return out


def test_one_key_is_first_come_first_served() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(5):
        q.push("a", f"a{i}")
    assert len(q) == 5 and q.by_key() == {"a": 5}
    assert drain(q) == [f"a{i}" for i in range(5)]
    assert not q and q.pop() is None


def test_a_flood_does_not_starve_a_later_key() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(10):
        q.push("flood", f"f{i}")
    assert q.pop() == "f0"
    q.push("other", "o0")
    q.push("other", "o1")
    # The other key's requests alternate with the flood instead of waiting behind all of it.
    assert drain(q)[:4] == ["o0", "f1", "o1", "f2"]


def test_weights_share_the_turns() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(9):
        q.push("heavy", f"h{i}", weight=2)
        q.push("light", f"l{i}", weight=1)
    first_nine = drain(q)[:9]
    assert sum(x.startswith("h") for x in first_nine) == 6


def test_idle_time_earns_no_credit() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("b", "b0")
    assert q.pop() == "b0"
    for i in range(4):
        q.push("a", f"a{i}")
    for _ in range(3):
        q.pop()
    q.push("a", "a4")
    # b was idle while a was served three times: it rejoins at the queue's virtual time and
    # takes turns with a, not three turns in a row.
    q.push("b", "b1")
    q.push("b", "b2")
    q.push("b", "b3")
    assert drain(q) == ["b1", "a3", "b2", "a4", "b3"]


def test_ineligible_keys_are_skipped_not_dropped() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("capped", "c0")
    q.push("free", "f0")
    assert q.pop(lambda head: head != "c0") == "f0"
    assert q.pop(lambda head: head != "c0") is None
    assert q.pop() == "c0"


def test_remove_takes_out_one_waiter() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("a", "a0")
    q.push("a", "a1")
    assert q.remove("a", "a0") and not q.remove("a", "a0") and not q.remove("zz", "a1")
    assert len(q) == 1 and list(q) == ["a1"]


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(1, 3)), max_size=60))
def test_every_item_comes_out_once_in_its_keys_order(pushes: list[tuple[str, int]]) -> None:
    q: FairQueue[tuple[str, int]] = FairQueue()
    weights: dict[str, int] = {}
    for n, (key, weight) in enumerate(pushes):
        weight = weights.setdefault(key, weight)
        q.push(key, (key, n), weight)
    out = drain(q)  # type: ignore[arg-type]
    assert sorted(out) == sorted((k, n) for n, (k, _) in enumerate(pushes))
    for key in "abcd":
        mine = [n for k, n in out if k == key]
        assert mine == sorted(mine)


@given(st.integers(2, 30), st.integers(1, 30))
def test_two_backlogged_keys_never_drift_apart(a_count: int, b_count: int) -> None:
    q: FairQueue[str] = FairQueue()
    for _ in range(a_count):
        q.push("a", "a")
    for _ in range(b_count):
        q.push("b", "b")
    out = drain(q)
    served = {"a": 0, "b": 0}
    for item in out:
        served[item] += 1
        both_waiting = served["a"] < a_count and served["b"] < b_count
        if both_waiting:
            assert abs(served["a"] - served["b"]) <= 1
