"""Incremental detokenization: token ids in, finished text out, one token at a time.

Byte-level BPE tokens can end in the middle of a UTF-8 character (CJK, emoji), so text is only
released once it decodes without a trailing replacement character. Each step decodes a short
window (from the last clean boundary), so the cost per token stays small.
"""

from __future__ import annotations

from inferno.frontend.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas whose concatenation is `decode(all ids)`."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._ids: list[int] = []
        self._prefix = 0  # window start: a clean character boundary before `_read`
        self._read = 0  # ids up to here have been released as text
        self._parts: list[str] = []

    def _decode(self, start: int, stop: int) -> str:
        return self._tokenizer.decode(self._ids[start:stop], skip_special=self._skip_special)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes ('' while a character is unfinished)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._prefix, self._read)
        new_text = self._decode(self._prefix, len(self._ids))
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""
        delta = new_text[len(prefix_text) :]
        self._prefix = self._read
        self._read = len(self._ids)
        self._parts.append(delta)
        return delta

    def flush(self) -> str:
        """At the end of the stream: release what is left (unfinished bytes become U+FFFD)."""
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._prefix, self._read)
        delta = self._decode(self._prefix, len(self._ids))[len(prefix_text) :]
        self._prefix = self._read = len(self._ids)
        self._parts.append(delta)
        return delta

    @property
    def text(self) -> str:
        """All text released so far."""
        return "".join(self._parts)

    @property
    def token_ids(self) -> list[int]:
        return list(self._ids)
