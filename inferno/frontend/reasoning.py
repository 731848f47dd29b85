"""Split model output into reasoning (inside `<think>...</think>`) and the visible answer.

Qwen3.5 writes `reasoning\\n</think>\\n\\nanswer`: with thinking on, the prompt already opened the
block (`<|im_start|>assistant\\n<think>\\n`), so output starts in reasoning; with thinking off the
prompt closed it and output is answer text, unless the model opens `<think>` itself at the start.
Newlines around the tags (which the chat template adds) are stripped from both parts.
"""

from __future__ import annotations

THINK = "<think>"
THINK_END = "</think>"

# states
_OPENING = "opening"  # before any text: a leading <think> may still come
_REASONING = "reasoning"
_AFTER = "after"  # just after </think>: drop newlines
_CONTENT = "content"


def partial_suffix_len(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags`."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


class ReasoningSplitter:
    """Streaming split of text deltas into `(reasoning_delta, content_delta)`.

    `in_reasoning`: True when the prompt ended inside an open think block (thinking on).
    """

    def __init__(self, in_reasoning: bool):
        self._state = _OPENING
        self._reasoning_first = in_reasoning  # where text goes when no <think> leads the output
        self._buffer = ""
        self._fresh = False  # in reasoning, nothing released yet: leading newlines are dropped
        self._saw_reasoning = False

    @property
    def in_reasoning(self) -> bool:
        """True while output is (or would be, at the start) reasoning text."""
        return self._state == _REASONING or (self._state == _OPENING and self._reasoning_first)

    @property
    def saw_reasoning(self) -> bool:
        """True once the output has been found to contain a reasoning part."""
        return self._saw_reasoning

    def push(self, delta: str) -> tuple[str, str]:
        """Add a text delta; return the reasoning and content text now known to be final."""
        self._buffer += delta
        reasoning, content = [], []
        while self._buffer:
            if self._state == _OPENING:
                head = self._buffer.lstrip()
                if head.startswith(THINK):
                    self._buffer = head[len(THINK) :]
                    self._enter_reasoning()
                elif THINK.startswith(head):  # whitespace or a partial "<think>": wait
                    break
                elif self._reasoning_first:
                    self._enter_reasoning()
                else:
                    self._state = _CONTENT
            elif self._state == _REASONING:
                if self._fresh:
                    self._buffer = self._buffer.lstrip("\n")
                    if not self._buffer:
                        break
                end = self._buffer.find(THINK_END)
                if end >= 0:
                    reasoning.append(self._buffer[:end].rstrip("\n"))
                    self._buffer = self._buffer[end + len(THINK_END) :]
                    self._state = _AFTER
                    continue
                # Hold back a partial "</think>" and the newlines before it.
                keep = partial_suffix_len(self._buffer, (THINK_END,))
                ready = self._buffer[: len(self._buffer) - keep].rstrip("\n")
                if ready:
                    reasoning.append(ready)
                    self._fresh = False
                self._buffer = self._buffer[len(ready) :]
                break
            elif self._state == _AFTER:
                self._buffer = self._buffer.lstrip("\n")
                if self._buffer:
                    self._state = _CONTENT
            else:
                content.append(self._buffer)
                self._buffer = ""
        return "".join(reasoning), "".join(content)

    def _enter_reasoning(self) -> None:
        self._state = _REASONING
        self._fresh = True
        self._saw_reasoning = True

    def finish(self) -> tuple[str, str]:
        """End of output: release held-back text (an unclosed think block stays reasoning)."""
        buffer, self._buffer = self._buffer, ""
        if self._state == _REASONING or (self._state == _OPENING and self._reasoning_first):
            text = buffer.rstrip("\n")
            if self._state == _OPENING or self._fresh:
                text = text.lstrip("\n")
            return text, ""
        if self._state == _AFTER:
            return "", ""
        return "", buffer


def split_reasoning(text: str, in_reasoning: bool) -> tuple[str, str]:
    """One-shot split of a whole output into `(reasoning, content)`."""
    splitter = ReasoningSplitter(in_reasoning)
    r1, c1 = splitter.push(text)
    r2, c2 = splitter.finish()
    return r1 + r2, c1 + c2
