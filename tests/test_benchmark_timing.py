"""benchmarks/_timing.py, the one timing module of the benchmark scripts: how many calls each
contender gets (warm-up, repeats, slow and warm-up-only contenders), in which order."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "_timing.py"
_spec = importlib.util.spec_from_file_location("benchmarks_timing", _PATH)
_timing = sys.modules["benchmarks_timing"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_timing)


class FakeClock:
    """``time.perf_counter`` advanced by the calls themselves: each call of a contender
    takes the seconds it is given."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(_timing.time, "perf_counter", fake)
    return fake


def contender(clock, seconds, log, name):
    def call():
        log.append(name)
        clock.now += seconds
        return name
    return call


def test_round_robin_warms_up_then_takes_turns(clock):
    log = []
    calls = {"a": contender(clock, 0.1, log, "a"), "b": contender(clock, 0.3, log, "b")}
    out = _timing.round_robin(calls, {"a": 3, "b": 2}, slow_s=10.0)
    assert log == ["a", "b", "a", "b", "a", "b", "a"]
    assert out["a"].times == pytest.approx([0.1] * 3) and out["b"].best == pytest.approx(0.3)
    assert out["a"].warmup == pytest.approx(0.1) and out["b"].out == "b"
    assert out["a"].median == pytest.approx(0.1)


def test_slow_and_warmup_only_contenders(clock):
    log = []
    calls = {"fast": contender(clock, 0.1, log, "fast"), "slow": contender(clock, 3.0, log, "slow"),
             "once": contender(clock, 20.0, log, "once")}
    out = _timing.round_robin(calls, 4, slow_s=2.0, once_s=15.0, slow_repeats=2)
    assert [len(out[k].times) for k in calls] == [4, 2, 1]
    assert out["once"].warmup_only and out["once"].best == pytest.approx(20.0)
    assert log.count("once") == 1 and log.count("slow") == 3 and log.count("fast") == 5


def test_caller_warm_ups_and_no_warm_up(clock):
    log = []
    a, b = contender(clock, 0.1, log, "a"), contender(clock, 0.2, log, "b")
    warmed = {"a": _timing.warm_up(a)}
    out = _timing.round_robin({"a": a, "b": b}, 2, warmed=warmed, warmup=False)
    assert log == ["a", "a", "b", "a", "b"]       # b: no warm-up at all
    assert out["a"] is warmed["a"] and out["b"].warmup == 0.0
    t = _timing.best_of(a, 3, slow_s=float("inf"), warmup=False)
    assert len(t.times) == 3 and log.count("a") == 6


def test_repeats_must_be_positive():
    with pytest.raises(ValueError, match="repeats"):
        _timing.round_robin({0: lambda: None}, 0)


def test_timed_and_timer(clock):
    out, secs = _timing.timed(lambda: setattr(clock, "now", clock.now + 0.5) or 7)
    assert (out, secs) == (7, pytest.approx(0.5))
    timer = _timing.Timer().start()
    clock.now += 1.25
    assert timer.elapsed == pytest.approx(1.25) and timer.stop() == pytest.approx(1.25)
