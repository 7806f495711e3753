"""Per-key sliding-minute limits: charged before dispatch, corrected after."""

from __future__ import annotations

import pytest

from inferlab._clock import NS_PER_S, VirtualClock
from inferlab.gateway.config import KeyConfig
from inferlab.gateway.ratelimit import Limited, RateLimiter


def key(**kw: object) -> KeyConfig:
    return KeyConfig("k", "0" * 64, **kw)  # type: ignore[arg-type]


def test_rpm_refuses_past_the_limit_until_the_window_slides() -> None:
    clock = VirtualClock()
    rl, k = RateLimiter(clock), key(rpm=3)
    for t in (0, 10, 20):
        clock.advance_to_ns(t * NS_PER_S)
        rl.reserve(k, 1, 1)
    clock.advance_to_ns(30 * NS_PER_S)
    with pytest.raises(Limited) as e:
        rl.reserve(k, 1, 1)
    assert e.value.retry_after_s == pytest.approx(30.0)  # the first charge leaves at 60 s
    assert e.value.headers["x-ratelimit-remaining-requests"] == "0"
    # reset: until the window is back to its initial state (the last charge, at 20 s, gone
    # at 80 s), as the tokens' reset counts until every token is gone
    assert e.value.headers["x-ratelimit-reset-requests"] == "50.000s"
    clock.advance_to_ns(60 * NS_PER_S + 1)
    rl.reserve(k, 1, 1)


def test_tpm_is_charged_before_and_corrected_after() -> None:
    clock = VirtualClock()
    rl, k = RateLimiter(clock), key(tpm=1000)
    c1 = rl.reserve(k, 100, 500)  # 600 reserved
    with pytest.raises(Limited):
        rl.reserve(k, 100, 500)  # 1,200 > 1,000: refused before it is sent
    rl.correct(k, c1, 100, 50)  # it used 150
    rl.reserve(k, 100, 500)  # 750: fits now
    assert rl.headers(k)["x-ratelimit-remaining-tokens"] == "250"
    # and with requests left, the requests' reset is when the window empties, not 0
    clock, both = VirtualClock(), key(rpm=10, tpm=1000)
    rl = RateLimiter(clock)
    rl.reserve(both, 10, 10)
    clock.advance_to_ns(15 * NS_PER_S)
    h = rl.headers(both)
    assert h["x-ratelimit-remaining-requests"] == "9"
    assert h["x-ratelimit-reset-requests"] == h["x-ratelimit-reset-tokens"] == "45.000s"


def test_tpm_counts_what_the_key_says() -> None:
    rl = RateLimiter(VirtualClock())
    assert rl.counted(key(tpm_counts="input"), 7, 5) == 7
    assert rl.counted(key(tpm_counts="output"), 7, 5) == 5
    assert rl.counted(key(), 7, 5) == 12


def test_retry_after_is_when_enough_tokens_leave_the_window() -> None:
    clock = VirtualClock()
    rl, k = RateLimiter(clock), key(tpm=100)
    rl.reserve(k, 40, 0)
    clock.advance_to_ns(20 * NS_PER_S)
    rl.reserve(k, 40, 0)
    clock.advance_to_ns(30 * NS_PER_S)
    with pytest.raises(Limited) as e:
        rl.reserve(k, 50, 0)  # needs the first 40 gone: at 60 s
    assert e.value.retry_after_s == pytest.approx(30.0)
    with pytest.raises(Limited) as e:
        rl.reserve(k, 90, 0)  # needs both gone: at 80 s
    assert e.value.retry_after_s == pytest.approx(50.0)


def test_a_request_over_the_whole_limit_is_refused_with_no_retry_time() -> None:
    rl, k = RateLimiter(VirtualClock()), key(tpm=100)
    with pytest.raises(Limited) as e:
        rl.reserve(k, 90, 20)
    assert e.value.retry_after_s is None and "too large" in str(e.value)
