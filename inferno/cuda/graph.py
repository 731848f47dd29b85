"""CUDA graphs: capture launches on a stream, instantiate, replay, and retarget kernel arguments.

    with Graph.capture(stream) as g:
        launch(k1, ..., stream=stream); launch(k2, ..., stream=stream)
    ge = g.instantiate()
    ge.launch(stream)                                  # replay
    node = ge.kernel_nodes()[1]                        # capture order
    ge.update_kernel_params(node, new_packed_params)   # values are copied at this call

Kernel arguments are copied into the graph when captured; changing a PackedParams afterwards
has no effect on the graph until `update_kernel_params`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferno.cuda.driver import driver
from inferno.cuda.errors import CudaError, InfernoError, LaunchError, check, error_detail, result_name
from inferno.cuda.module import func_param_sizes
from inferno.cuda.params import PackedParams
from inferno.cuda.stream import stream_handle


class Graph:
    """A captured graph. Use `Graph.capture(stream)` as a context manager, then `instantiate()`."""

    def __init__(self, stream: Any):
        self.stream = stream
        self.handle: Any = None
        self._capturing = False

    @classmethod
    def capture(cls, stream: Any) -> "Graph":
        """Context manager capturing the work enqueued on `stream` (not the legacy default stream)."""
        if stream is None or stream == 0:
            raise InfernoError("graph capture needs a created Stream, not the legacy default stream")
        return cls(stream)

    def __enter__(self) -> "Graph":
        if self.handle is not None or self._capturing:
            raise InfernoError("this Graph was already captured; make a new one with Graph.capture(stream)")
        cu = driver()
        check(cu.cuStreamBeginCapture(stream_handle(self.stream), cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
              "cuStreamBeginCapture")
        self._capturing = True
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        cu = driver()
        self._capturing = False
        err, graph = cu.cuStreamEndCapture(stream_handle(self.stream))
        if exc_type is not None:  # the body failed: drop what was captured, let its error through
            if not err and graph is not None and int(graph):
                cu.cuGraphDestroy(graph)
            return
        if err:
            raise CudaError("cuStreamEndCapture", result_name(err), error_detail(err),
                            "graph capture (a synchronous call or another stream's work broke it)")
        self.handle = graph

    def node_count(self) -> int:
        self._require()
        _nodes, n = check(driver().cuGraphGetNodes(self.handle, 0), "cuGraphGetNodes")
        return int(n)

    def instantiate(self) -> "GraphExec":
        self._require()
        return GraphExec(check(driver().cuGraphInstantiate(self.handle, 0), "cuGraphInstantiate"), self)

    def _require(self) -> None:
        if self.handle is None:
            raise InfernoError("graph not captured yet: use `with Graph.capture(stream) as g:` first")

    def close(self) -> None:
        h, self.handle = self.handle, None
        if h is not None:
            check(driver().cuGraphDestroy(h), "cuGraphDestroy")


@dataclass
class KernelNode:
    """A kernel node of the captured graph (`index` = position among kernel nodes, capture order)."""

    index: int
    handle: Any  # CUgraphNode of the source graph
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    params: Any  # CUDA_KERNEL_NODE_PARAMS as captured
    param_sizes: list[int]


class GraphExec:
    """An instantiated graph: `launch(stream)` replays it."""

    def __init__(self, handle: Any, graph: Graph):
        self.handle = handle
        self.graph = graph
        self._nodes: list[KernelNode] | None = None
        self._launch = driver().cuGraphLaunch

    def launch(self, stream: Any = None) -> None:
        """Replay the graph on `stream` (None: the legacy default stream)."""
        (err,) = self._launch(self.handle, stream_handle(stream))
        if err:
            check((err,), "cuGraphLaunch")

    def upload(self, stream: Any = None) -> None:
        """Upload the graph ahead of its first launch (takes that cost out of the first replay)."""
        check(driver().cuGraphUpload(self.handle, stream_handle(stream)), "cuGraphUpload")

    def kernel_nodes(self) -> list[KernelNode]:
        """The kernel nodes in capture order."""
        if self._nodes is None:
            cu = driver()
            g = self.graph.handle
            _n, count = check(cu.cuGraphGetNodes(g, 0), "cuGraphGetNodes")
            nodes, _count = check(cu.cuGraphGetNodes(g, int(count)), "cuGraphGetNodes")
            out = []
            for node in nodes:
                ntype = check(cu.cuGraphNodeGetType(node), "cuGraphNodeGetType")
                if ntype != cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                    continue
                p = check(cu.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams")
                out.append(KernelNode(len(out), node, _func_name(p.func), (p.gridDimX, p.gridDimY, p.gridDimZ),
                                      (p.blockDimX, p.blockDimY, p.blockDimZ), p.sharedMemBytes, p,
                                      func_param_sizes(p.func, "graph node")))
            self._nodes = out
        return list(self._nodes)

    def update_kernel_params(self, node: KernelNode | int, params: PackedParams) -> None:
        """Give a kernel node new argument values (copied now; `params` may change afterwards)."""
        if isinstance(node, int):
            nodes = self.kernel_nodes()
            if not 0 <= node < len(nodes):
                raise InfernoError(f"graph has {len(nodes)} kernel nodes; no node {node}")
            node = nodes[node]
        if not isinstance(params, PackedParams):
            raise LaunchError(f"graph node {node.name}: params must be PackedParams, got {type(params).__name__}")
        if list(params.layout.sizes) != node.param_sizes:
            raise LaunchError(f"graph node {node.index} ({node.name}) takes parameters of sizes {node.param_sizes}, "
                              f"the new arguments ({params.kernel}) have sizes {list(params.layout.sizes)}")
        p = node.params
        p.kernelParams = params.address
        p.extra = 0
        check(driver().cuGraphExecKernelNodeSetParams(self.handle, node.handle, p), "cuGraphExecKernelNodeSetParams",
              f"graph node {node.index} ({node.name})")

    def close(self) -> None:
        h, self.handle = self.handle, None
        if h is not None:
            check(driver().cuGraphExecDestroy(h), "cuGraphExecDestroy")


def _func_name(func: Any) -> str:
    err, name = driver().cuFuncGetName(func)
    if err:
        return "?"
    return name.decode() if isinstance(name, bytes) else str(name)
