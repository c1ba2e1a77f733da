"""torch's current GPU stream as its raw handle, for the per-layer paths of hetmesh.stepmesh
(fserver_lib) and hetmesh.vllm_afd: making a stream object each layer costs microseconds."""

from __future__ import annotations

from ._interpreter import import_torch


def raw_current_stream():
    """A function of a GPU index giving torch's current stream there as its raw handle."""
    torch = import_torch()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw if raw is not None else lambda index: torch.cuda.current_stream(index).cuda_stream
