"""Server-sent events framing and the streaming response type."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse

DONE = b"data: [DONE]\n\n"


def event(data: dict, name: str | None = None) -> bytes:
    """One SSE frame: an optional `event:` line and one `data:` line of compact JSON."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {payload}\n\n".encode()


def sse_response(frames: AsyncIterator[bytes]) -> StreamingResponse:
    """A `text/event-stream` response that is not buffered by proxies."""
    return StreamingResponse(
        frames,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
