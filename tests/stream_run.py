"""Queue work on a stream eagerly or as a CUDA graph replayed once (the GPU PDL-chain tests share it)."""

from collections.abc import Callable

from inferno.cuda.graph import Graph


def run_queued(stream, queue: Callable[[], None], graph: bool) -> None:
    """queue() puts its launches on `stream`: run them as they are queued, or (graph) capture them into
    a CUDA graph and launch it once; then wait for the stream."""
    if graph:
        with Graph.capture(stream) as g:
            queue()
        ge = g.instantiate()
        ge.launch(stream)
        stream.synchronize()
        ge.close()
        g.close()
    else:
        queue()
        stream.synchronize()
