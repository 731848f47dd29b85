"""`Engine`: lanes, bounded admission, queue timeout, cancellation, errors, shutdown."""

import threading
import time

import pytest

from fake_executor import FakeExecutor, greedy_continuation
from inferno.engine import (
    ContextLengthError,
    Engine,
    EngineBusyError,
    EngineClosedError,
    EngineConfigError,
    GenerationRequest,
    QueueTimeoutError,
    SamplingParams,
)

GREEDY = SamplingParams(temperature=0)


def req(prompt=(1, 2, 3), n=5):
    return GenerationRequest(list(prompt), n, GREEDY)


def tokens(stream):
    return [e.token_id for e in stream if e.token_id is not None]


def wait_until(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.005)


def test_engine_generates_like_the_loop():
    ex = FakeExecutor()
    with Engine(ex, prefill_chunk=2) as engine:
        events = list(engine.generate(req((4, 5, 6), 6)))
    assert [e.token_id for e in events] == greedy_continuation([4, 5, 6], 6)
    assert events[-1].finish_reason == "length"
    assert events[-1].stats.queue_s >= 0
    assert ex.prefill_calls == [2, 1]
    assert ex.all_released()


def test_concurrent_requests_interleave_without_overlapping_executor_calls():
    ex = FakeExecutor(delay=0.002)
    with Engine(ex, max_concurrency=4) as engine:
        prompts = [(i, i + 1) for i in range(1, 9)]
        results: dict = {}

        def consume(p):
            results[p] = tokens(engine.generate(req(p, 12)))

        threads = [threading.Thread(target=consume, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for p in prompts:
        assert results[p] == greedy_continuation(p, 12)
    assert ex.max_active_calls == 1
    assert len(ex.states) == 8 and ex.all_released()


def test_lanes_run_requests_at_the_same_time():
    gate = threading.Event()
    ex = FakeExecutor(gate=gate)
    with Engine(ex, max_concurrency=2) as engine:
        a, b = engine.generate(req(n=3)), engine.generate(req(n=3))
        wait_until(lambda: engine.load() == (2, 0))
        gate.set()
        assert len(tokens(a)) == 3 and len(tokens(b)) == 3


def test_full_queue_refuses_at_once():
    gate = threading.Event()
    ex = FakeExecutor(gate=gate)
    with Engine(ex, max_concurrency=1, max_pending=1) as engine:
        first = engine.generate(req())
        wait_until(lambda: engine.load() == (1, 0))
        second = engine.generate(req())
        with pytest.raises(EngineBusyError, match="retry later"):
            engine.generate(req())
        gate.set()
        assert len(tokens(first)) == 5 and len(tokens(second)) == 5
        assert len(tokens(engine.generate(req()))) == 5  # capacity is back


def test_waiting_past_the_timeout_raises_queue_timeout():
    gate = threading.Event()
    ex = FakeExecutor(gate=gate)
    with Engine(ex, max_concurrency=1, max_pending=1, pending_timeout=0.1) as engine:
        first = engine.generate(req())
        second = engine.generate(req())
        with pytest.raises(QueueTimeoutError, match="no generation lane"):
            next(second)
        with pytest.raises(StopIteration):
            next(second)
        third = engine.generate(req())  # the timed-out request gave its queue slot back
        gate.set()
        assert len(tokens(first)) == 5 and len(tokens(third)) == 5
    assert len(ex.states) == 2  # the timed-out request never started


def test_closing_a_stream_cancels_the_running_request_and_frees_the_lane():
    ex = FakeExecutor(delay=0.001)
    with Engine(ex, max_concurrency=1, max_pending=0) as engine:
        stream = engine.generate(req(n=4000))
        next(stream)
        next(stream)
        stream.close()
        wait_until(lambda: engine.load() == (0, 0))
        assert ex.all_released()
        assert len(tokens(engine.generate(req()))) == 5


def test_caller_cancel_event_finishes_with_cancelled():
    ex = FakeExecutor(delay=0.001)
    cancel = threading.Event()
    with Engine(ex) as engine:
        events = []
        for e in engine.generate(req(n=4000), cancel=cancel):
            events.append(e)
            if len(events) == 3:
                cancel.set()
    assert events[-1].finish_reason == "cancelled"
    assert 3 < len(events) < 4000  # tokens the lane made before it saw the cancel still arrive
    assert ex.all_released()


def test_cancelled_while_waiting_never_starts():
    gate = threading.Event()
    ex = FakeExecutor(gate=gate)
    with Engine(ex, max_concurrency=1, max_pending=1) as engine:
        first = engine.generate(req())
        wait_until(lambda: engine.load() == (1, 0))
        cancel = threading.Event()
        second = engine.generate(req(), cancel=cancel)
        cancel.set()
        third = engine.generate(req())  # the cancelled one gave its queue slot back
        assert [e.finish_reason for e in second] == ["cancelled"]
        gate.set()
        assert len(tokens(first)) == 5 and len(tokens(third)) == 5
    assert len(ex.states) == 2


def test_waiting_stream_notices_its_cancel_without_other_traffic():
    gate = threading.Event()
    ex = FakeExecutor(gate=gate)
    with Engine(ex, max_concurrency=1, pending_timeout=None) as engine:
        first = engine.generate(req())
        cancel = threading.Event()
        second = engine.generate(req(), cancel=cancel)
        threading.Timer(0.05, cancel.set).start()
        t0 = time.monotonic()
        assert [e.finish_reason for e in second] == ["cancelled"]
        assert time.monotonic() - t0 < 2.0
        gate.set()
        assert len(tokens(first)) == 5
    assert len(ex.states) == 1


def test_request_errors_raise_before_queueing():
    ex = FakeExecutor()
    with Engine(ex, max_context=16) as engine:
        with pytest.raises(ContextLengthError):
            engine.generate(req(range(1, 11), 7))
        assert engine.load() == (0, 0)
    assert ex.states == []


def test_executor_error_reaches_the_consumer_and_the_lane_survives():
    ex = FakeExecutor(fail_after=3)
    with Engine(ex) as engine:
        with pytest.raises(RuntimeError, match="executor failure"):
            tokens(engine.generate(req(n=10)))
        ex.fail_after = None
        assert len(tokens(engine.generate(req()))) == 5
    assert ex.all_released()


def test_close_cancels_running_and_refuses_new():
    ex = FakeExecutor(delay=0.001)
    engine = Engine(ex, max_concurrency=1)
    stream = engine.generate(req(n=4000))
    waiting = engine.generate(req())
    next(stream)
    engine.close()
    assert [e.finish_reason for e in stream][-1] == "cancelled"
    with pytest.raises(EngineClosedError):
        next(waiting)
    with pytest.raises(EngineClosedError):
        engine.generate(req())
    assert ex.all_released()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_concurrency": 0},
        {"max_concurrency": 9},
        {"max_pending": -1},
        {"pending_timeout": 0},
        {"prefill_chunk": 0},
        {"max_context": 1},
        {"max_context": 10**9},
    ],
)
def test_engine_settings_validated(kwargs):
    with pytest.raises(EngineConfigError):
        Engine(FakeExecutor(), **kwargs)


def test_started_is_set_when_a_lane_takes_the_request_not_while_it_waits():
    gate = threading.Event()
    ex = FakeExecutor(gate=gate)
    with Engine(ex, max_concurrency=1, max_pending=1) as engine:
        first = engine.generate(req())
        assert first.started.wait(5)  # running (held at its first step by the gate)
        second = engine.generate(req())
        time.sleep(0.05)
        assert not second.started.is_set()
        gate.set()
        assert len(tokens(first)) == 5
        assert second.started.wait(5)
        assert len(tokens(second)) == 5
