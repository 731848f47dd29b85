"""A bounded in-memory store of Responses API results (for `previous_response_id` and GET/DELETE).

Oldest records are evicted first once either bound (record count, approximate bytes) is passed.
Nothing survives a restart.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class StoredResponse:
    """A finished response: the wire object, its input items, and the conversation it continues."""

    response: dict
    input_items: list[dict]
    messages: list[dict]  # the whole conversation in chat form, this response's output included

    def size(self) -> int:
        return len(json.dumps([self.response, self.input_items, self.messages], ensure_ascii=False))


class ResponseStore:
    def __init__(self, max_records: int = 256, max_bytes: int = 64 << 20):
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[StoredResponse, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, record: StoredResponse) -> None:
        size = record.size()
        key = record.response["id"]
        with self._lock:
            self._drop(key)
            self._items[key] = (record, size)
            self._bytes += size
            while self._items and (len(self._items) > self.max_records or self._bytes > self.max_bytes):
                self._drop(next(iter(self._items)))

    def get(self, key: str) -> StoredResponse | None:
        with self._lock:
            found = self._items.get(key)
            return None if found is None else found[0]

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._drop(key)

    def __len__(self) -> int:
        return len(self._items)

    def _drop(self, key: str) -> bool:
        found = self._items.pop(key, None)
        if found is None:
            return False
        self._bytes -= found[1]
        return True
