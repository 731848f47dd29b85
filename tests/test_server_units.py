"""Small server pieces without HTTP: the model-name rule, the response store bounds, SSE framing."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from inferno.server.errors import ApiError
from inferno.server.response_store import ResponseStore, StoredResponse
from inferno.server.service import Deployment
from inferno.server.sse import event


def deployment(**kw) -> Deployment:
    return Deployment(SimpleNamespace(), "qwen3.6-27b", aliases=("qwen3.6-27b", "qwen3.6-27b/q4g64", "my-artifact"), **kw)


@pytest.mark.parametrize("name", [None, "", "qwen3.6-27b", "QWEN3.6-27B", "Qwen/qwen3.6-27b", "qwen3.6-27b/q4g64", "my-artifact", " qwen3.6-27b "])
def test_model_names_accepted(name):
    deployment().check_model(name)


@pytest.mark.parametrize("name", ["q4g64", "gpt-4o", "qwen3.6", "claude-sonnet-4-5"])
def test_model_names_refused(name):
    with pytest.raises(ApiError) as e:
        deployment().check_model(name)
    assert e.value.status == 404 and "qwen3.6-27b" in e.value.message
    deployment(accept_any_model=True).check_model(name)


def test_model_name_must_be_a_string():
    with pytest.raises(ApiError) as e:
        deployment().check_model(["x"])
    assert e.value.status == 400


def record(i: int, size: int = 10) -> StoredResponse:
    return StoredResponse({"id": f"resp_{i}", "pad": "x" * size}, [], [])


def test_store_evicts_oldest_by_count():
    store = ResponseStore(max_records=3)
    for i in range(5):
        store.put(record(i))
    assert len(store) == 3 and store.get("resp_0") is None and store.get("resp_4") is not None
    assert store.delete("resp_4") and not store.delete("resp_4") and len(store) == 2


def test_store_evicts_oldest_by_bytes():
    one = record(0, 1000).size()
    store = ResponseStore(max_records=100, max_bytes=int(2.5 * one))
    for i in range(4):
        store.put(record(i, 1000))
    assert [store.get(f"resp_{i}") is not None for i in range(4)] == [False, False, True, True]


def test_store_zero_records_keeps_nothing():
    store = ResponseStore(max_records=0)
    store.put(record(1))
    assert store.get("resp_1") is None


def test_sse_frame():
    frame = event({"a": "é\nb"}, "message_start").decode()
    assert frame.startswith("event: message_start\ndata: ") and frame.endswith("\n\n")
    data = frame.split("data: ", 1)[1].strip()
    assert "\n" not in data and json.loads(data) == {"a": "é\nb"}
    assert event({"x": 1}).decode() == 'data: {"x":1}\n\n'
