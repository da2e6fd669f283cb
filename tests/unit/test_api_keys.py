"""API keys (pure): the spec's limits, lane entitlement, the per-minute window, the headers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.domain.api_keys import (
    ANONYMOUS,
    InvalidKeySpec,
    KeySpec,
    LaneForbidden,
    RateDecision,
    RateLimited,
    RateWindow,
    entitle,
    format_reset,
    key_cap,
    rate_limited,
    ratelimit_headers,
    window_for,
)
from appliance.domain.lanes import Lane

# R, N (iNteractive), B: short names keep the lane tables readable.
R, N, B = Lane.REALTIME, Lane.INTERACTIVE, Lane.BATCH


def spec(max_lane: Lane = R, **kw: object) -> KeySpec:
    return KeySpec(name="alice", max_lane=max_lane, **kw)  # type: ignore[arg-type]


# --- the spec ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "Alice"}, "name"),
        ({"name": "-alice"}, "name"),
        ({"name": "a" * 65}, "name"),
        ({"name": "a b"}, "name"),
        ({"requests_per_min": 0}, "requests_per_min"),
        ({"tokens_per_min": -5}, "tokens_per_min"),
        ({"concurrency_share": 0.0}, "concurrency_share"),
        ({"concurrency_share": 1.01}, "concurrency_share"),
        ({"weight": 0}, "weight"),
        ({"weight": 101}, "weight"),
    ],
)
def test_bad_spec_names_the_field(kw: dict[str, object], field: str):
    args: dict[str, object] = {"name": "alice", "max_lane": R, **kw}
    with pytest.raises(InvalidKeySpec) as err:
        KeySpec(**args)  # type: ignore[arg-type]
    assert err.value.field == field and field in str(err.value)


@pytest.mark.parametrize("name", ["a", "a" * 64, "team-1.prod_x", "0day"])
def test_good_names(name: str):
    assert KeySpec(name=name, max_lane=B).name == name


def test_lanes_below_the_ceiling_and_anonymous():
    assert spec(R).lanes == (R, N, B)
    assert spec(N).lanes == (N, B)
    assert spec(B).lanes == (B,)
    assert ANONYMOUS.lanes == (R, N, B) and not ANONYMOUS.limited
    assert key_cap(ANONYMOUS, 10) is None and window_for(ANONYMOUS) is None


# --- lanes -----------------------------------------------------------------------------------

# (ceiling, asked, served or None for a 403 without downgrade)
_TABLE = [
    (R, R, R),
    (R, N, N),
    (R, B, B),
    (N, R, None),
    (N, N, N),
    (N, B, B),
    (B, R, None),
    (B, N, None),
    (B, B, B),
]


@pytest.mark.parametrize(("ceiling", "asked", "served"), _TABLE)
def test_entitle_without_downgrade(ceiling: Lane, asked: Lane, served: Lane | None):
    key = spec(ceiling)
    if served is None:
        with pytest.raises(LaneForbidden) as err:
            entitle(key, asked)
        exc = err.value
        assert (exc.status, exc.type, exc.code, exc.param) == (
            403,
            "permission_error",
            "lane_not_allowed",
            "priority",
        )
        assert asked.label in exc.message and ceiling.label in exc.message
        assert "'alice'" in exc.message
    else:
        grant = entitle(key, asked)
        assert grant.lane == served and not grant.downgraded


@pytest.mark.parametrize(("ceiling", "asked", "served"), _TABLE)
def test_entitle_with_downgrade(ceiling: Lane, asked: Lane, served: Lane | None):
    grant = entitle(spec(ceiling, downgrade=True), asked)
    assert grant.lane == (ceiling if served is None else served)
    assert grant.downgraded == (served is None)
    if grant.downgraded:
        assert asked.label in grant.reason and ceiling.label in grant.reason


@pytest.mark.parametrize(("ceiling", "served"), [(R, N), (N, N), (B, B)])
@pytest.mark.parametrize("downgrade", [False, True])
def test_no_priority_asked_is_never_a_403(ceiling: Lane, served: Lane, downgrade: bool):
    grant = entitle(spec(ceiling, downgrade=downgrade), None)
    assert grant.lane == served and not grant.downgraded and grant.reason


# --- concurrency share ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("share", "limit", "cap"),
    [
        (None, 10, None),
        (0.3, 10, 3),  # 0.3 * 10 is 3.0000000000000004 in floats: still 3
        (0.25, 10, 3),
        (0.5, 8, 4),
        (1.0, 7, 7),
        (0.01, 10, 1),  # at least one
        (0.5, 0, 1),
        (0.1, 1, 1),
    ],
)
def test_key_cap(share: float | None, limit: int, cap: int | None):
    assert key_cap(spec(concurrency_share=share), limit) == cap


# --- the per-minute window ---------------------------------------------------------------


def test_requests_per_minute_and_reset():
    w = RateWindow(requests_per_min=3, tokens_per_min=None)
    for t in (0.0, 10.0, 20.0):
        d = w.admit(t, 100)
        assert d.allowed
    assert d.remaining_requests == 0 and d.reset_requests_s == 60.0
    assert d.limit_tokens is None and d.remaining_tokens is None and d.reset_tokens_s is None
    d = w.check(30.0, 1)
    assert not d.allowed and d.remaining_requests == 0
    assert d.retry_after_s == pytest.approx(30.0)  # the request at 0 leaves at 60
    assert d.reset_requests_s == pytest.approx(50.0)  # the one at 20 leaves at 80
    assert "3 requests per minute" in d.reason
    # The window slides: at exactly 60 the first request has left.
    assert not w.check(59.999, 1).allowed
    d = w.admit(60.0, 1)
    assert d.allowed and d.remaining_requests == 0


def test_check_does_not_consume():
    w = RateWindow(requests_per_min=1, tokens_per_min=None)
    assert w.check(0.0, 1).allowed and w.check(0.0, 1).allowed
    w.consume(0.0, 1)
    assert not w.check(0.0, 1).allowed


def test_tokens_per_minute_retry_after_counts_what_must_leave():
    w = RateWindow(requests_per_min=None, tokens_per_min=1000)
    w.consume(0.0, 400)
    w.consume(10.0, 400)
    d = w.check(20.0, 200)
    assert d.allowed and d.remaining_tokens == 0 and d.reset_tokens_s == 60.0
    d = w.check(20.0, 500)
    # 800 used + 500 > 1000: 300 must leave, the 400 charged at 0 leave at 60.
    assert not d.allowed and d.remaining_tokens == 200
    assert d.retry_after_s == pytest.approx(40.0)
    assert d.reset_tokens_s == pytest.approx(50.0)
    assert "1000 tokens per minute" in d.reason and "800" in d.reason
    d = w.check(20.0, 700)  # 500 must leave: both entries
    assert d.retry_after_s == pytest.approx(50.0)


def test_both_limits_the_longer_wait_wins():
    w = RateWindow(requests_per_min=2, tokens_per_min=100)
    w.consume(0.0, 5)
    w.consume(30.0, 90)
    d = w.check(40.0, 20)
    assert not d.allowed
    # Requests: one must leave (at 60); tokens: 15 must leave, so the 90 at 30 too (at 90).
    assert d.retry_after_s == pytest.approx(50.0)
    assert "requests per minute" in d.reason and "tokens per minute" in d.reason


def test_a_request_bigger_than_the_minute_never_fits():
    w = RateWindow(requests_per_min=None, tokens_per_min=100)
    d = w.check(0.0, 101)
    assert not d.allowed and d.retry_after_s is None and "alone needs 101" in d.reason
    exc = rate_limited(spec(tokens_per_min=100), d)
    assert exc.retry_after_s == 60 and "fewer tokens" in exc.message


def test_settle_refunds_where_charged_and_charges_excess_now():
    w = RateWindow(requests_per_min=None, tokens_per_min=1000)
    w.consume(0.0, 800)  # estimate: prompt + max_tokens
    w.settle(5.0, charged=800, actual=300)
    d = w.check(5.0, 700)
    assert d.allowed and d.remaining_tokens == 0
    # The refund is at the charge's time: all of it leaves at 60.
    assert w.check(60.0, 1000).allowed
    # An answer longer than its estimate: the excess counts from when it is known.
    w2 = RateWindow(requests_per_min=None, tokens_per_min=1000)
    w2.consume(0.0, 100)
    w2.settle(50.0, charged=100, actual=700)
    assert not w2.check(55.0, 400).allowed
    assert w2.check(60.0, 400).allowed  # the 100 charged at 0 left
    assert not w2.check(60.0, 500).allowed  # the 600 excess stays until 110
    assert w2.check(110.0, 1000).allowed


def test_settle_of_a_request_that_left_the_window_is_a_no_op():
    w = RateWindow(requests_per_min=None, tokens_per_min=100)
    w.consume(0.0, 80)
    w.settle(70.0, charged=80, actual=10)
    assert w.check(70.0, 100).allowed


def test_settle_twice_refunds_two_requests_once_each():
    w = RateWindow(requests_per_min=None, tokens_per_min=1000)
    w.consume(0.0, 400)
    w.consume(1.0, 400)
    w.settle(2.0, 400, 100)
    w.settle(2.0, 400, 100)
    w.settle(2.0, 400, 100)  # a third settle has nothing left to refund
    assert w.check(2.0, 800).allowed and not w.check(2.0, 801).allowed


def test_an_overrun_settles_its_own_request_not_the_next_ones():
    w = RateWindow(requests_per_min=None, tokens_per_min=1000)
    w.consume(0.0, 100)
    w.consume(0.5, 100)
    w.settle(1.0, charged=100, actual=200)  # the first: +100 at 1.0
    w.settle(2.0, charged=100, actual=50)  # so this refund is the second's
    d = w.check(2.0, 0)
    assert d.remaining_tokens == 1000 - (100 + 100 + 50)


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.floats(0, 40, allow_nan=False), st.integers(0, 300), st.integers(0, 600)),
        max_size=80,
    )
)
def test_remaining_agrees_with_a_recount(ops: list[tuple[float, int, int]]):
    w = RateWindow(requests_per_min=None, tokens_per_min=10_000)
    now = 0.0
    charges: list[list[float]] = []  # [time, tokens] as a naive model keeps them
    for step, tokens, actual in ops:
        now += step
        w.consume(now, tokens)
        charges.append([now, tokens])
        w.settle(now, tokens, actual)
        if actual > tokens:
            charges.append([now, actual - tokens])
        else:
            charges[-1][1] = actual
        live = sum(tok for t, tok in charges if t > now - 60.0)
        assert w.check(now, 0).remaining_tokens == max(0, 10_000 - live)


_ops = st.lists(
    st.tuples(
        st.floats(0, 30, allow_nan=False),  # time step
        st.integers(0, 400),  # tokens asked
        st.one_of(st.none(), st.integers(0, 400)),  # settled to (None: not yet)
    ),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(
    rpm=st.one_of(st.none(), st.integers(1, 10)),
    tpm=st.one_of(st.none(), st.integers(1, 2000)),
    ops=_ops,
)
def test_never_more_than_the_limit_in_any_60_s(
    rpm: int | None, tpm: int | None, ops: list[tuple[float, int, int | None]]
):
    w = RateWindow(rpm, tpm)
    now = 0.0
    admitted: list[tuple[float, int]] = []  # (time, tokens charged, after settling)
    for step, tokens, actual in ops:
        now += step
        if w.admit(now, tokens).allowed:
            admitted.append((now, tokens))
            if actual is not None and actual <= tokens:  # refunds only: excess is unbounded
                w.settle(now, tokens, actual)
                admitted[-1] = (now, actual)
    for start, _ in admitted:  # every 60 s span that starts at an admission
        inside = [tok for t, tok in admitted if start <= t < start + 60.0]
        if rpm is not None:
            assert len(inside) <= rpm
        if tpm is not None:
            assert sum(inside) <= tpm


# --- headers and the 429 -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (-1.0, "0s"),
        (0.02, "20ms"),
        (0.0004, "0s"),
        (0.999, "999ms"),
        (1.0, "1s"),
        (1.5, "1.5s"),
        (17.347, "17.347s"),
        (59.9996, "1m0s"),
        (60.0, "1m0s"),
        (360.0, "6m0s"),
        (179.56, "2m59.56s"),
        (3723.0, "1h2m3s"),
    ],
)
def test_format_reset_like_openai(seconds: float, text: str):
    assert format_reset(seconds) == text


def _decision(**kw: object) -> RateDecision:
    base: dict[str, object] = dict.fromkeys(RateDecision.__dataclass_fields__)
    base.update(allowed=True, reason="within the limits", **kw)
    return RateDecision(**base)  # type: ignore[arg-type]


def test_headers_only_for_the_limits_the_key_has():
    assert ratelimit_headers(_decision()) == {}
    d = _decision(limit_requests=60, remaining_requests=59, reset_requests_s=1.0)
    assert ratelimit_headers(d) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
    }
    d = _decision(limit_tokens=150000, remaining_tokens=149984, reset_tokens_s=0.006)
    assert ratelimit_headers(d) == {
        "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-tokens": "6ms",
    }


def test_rate_limited_names_the_key_and_the_limit():
    key = spec(requests_per_min=2, tokens_per_min=1000)
    w = window_for(key)
    assert w is not None
    w.admit(0.0, 10)
    w.admit(1.0, 10)
    d = w.check(1.5, 10)
    exc = rate_limited(key, d)
    assert isinstance(exc, RateLimited)
    assert (exc.status, exc.type, exc.code) == (429, "rate_limit_error", "rate_limit_exceeded")
    assert exc.retry_after_s == 59  # 58.5 s, rounded up: never early
    assert "'alice'" in exc.message and "2 requests per minute" in exc.message
    assert exc.headers["x-ratelimit-remaining-requests"] == "0"
    assert exc.headers["x-ratelimit-reset-requests"] == "59.5s"
    assert exc.headers["x-ratelimit-limit-tokens"] == "1000"
    assert exc.headers["x-ratelimit-remaining-tokens"] == "980"


def test_rate_limited_retry_after_is_at_least_one_second():
    w = RateWindow(requests_per_min=1, tokens_per_min=None)
    w.consume(0.0, 0)
    d = w.check(59.9, 0)
    assert d.retry_after_s == pytest.approx(0.1)
    assert rate_limited(spec(requests_per_min=1), d).retry_after_s == 1
