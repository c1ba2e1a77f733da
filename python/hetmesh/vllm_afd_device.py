"""The vLLM connector's round trips rung and waited for by the device's stream (its option
`device_trigger`, which hetmesh.vllm turns on unless vLLM runs with enforce_eager), so that the
plugin's FULL_DECODE_ONLY runners can capture them in CUDA graphs: the A's forward with its sends
and receives, and the F's whole receive -> compute -> send loop per token-count key, replayed per
control message. Eager steps (prefill, a key with no graph yet) go the same way, not captured, so
a micro-batch is never the host's and the device's at once. docs/device-triggered.md says how the
words replay.

Each call only enqueues work on torch's current stream (on a host device, the engine's stream,
synchronized where the host reads the rows): no host call waits per layer. What it enqueues:

- A, send: the stage's doorbell rung with the row count and the tensor's layout (the engine's
  thread sends them): each tensor the engine can use (C order, the job's dtype and device) that a
  CUDA graph captures (on a host device, which captures none: every such tensor) is armed once as
  a layout of its stage, sent from and answered into in place, as a graph's layers each have
  theirs at a fixed address; eager steps on a GPU (prefill, warmup: tensors at new addresses),
  those past the engine's layouts, and a job of router logits copy their rows into the stage's
  send slot (layout 0). Receive: a hold until the answer is
  in, then, where it is not already in ref_tensor, its rows copied there. The router logits travel
  on every layer (the F reads them where its layer asks).
- F, receive: a hold until the stage's batch is in (every A of the group); the hidden states are a
  view of the engine's rows (with several As, their windows copied together). Send: the output's
  rows copied into each A's window of the engine's output slot, then the respond doorbell rung.

The F's copies (and the A's past its layouts) are the price of fixed addresses: what a ring
answers from is armed before it rings. A round trip that failed (a peer lost) lets its stream go on
with stale rows; the next step's control-plane call raises it (`check`), naming the peer.
"""

from __future__ import annotations

from . import _errors
from ._streams import raw_current_stream
from . import (AttentionEngine, ClosedError, JobFailedError, PeerLostError, TimeoutError,
               as_tensor, import_torch)


class _DeviceSide:
    def __init__(self, connector):
        self.connector = connector
        self.engine = connector.engine
        self.stages = range(connector.job["micro_batches"])
        self.window = connector.job["tokens"]
        self.wait_ms = connector.options["timeout_ms"] + 10000
        self.failed = 0  # the engine's count of failed round trips at the last check
        if connector._on_gpu:
            index = int(connector.device.partition(":")[2] or 0)
            raw = raw_current_stream()
            self._host_stream = None
            self.stream = lambda: raw(index)
        else:
            self._host_stream = self.engine.create_stream()
            self.stream = lambda: self._host_stream

    def drain(self) -> None:
        """On a host device: what the stream holds is done, so the host may read the rows."""
        if self._host_stream is not None:
            self._host_stream.synchronize(timeout_ms=self.wait_ms)

    def check(self) -> None:
        """Raises where round trips the device rang failed since the last check."""
        trips = self.engine.device_trips()
        failed, self.failed = trips.failed - self.failed, trips.failed
        if not failed:
            return
        c = self.connector
        why = trips.failures[0] if trips.failures else trips.ended or "no reason kept"
        peer = _errors.peer_in(why)
        cls = (PeerLostError if peer and (" lost" in why or " hung" in why)
               else TimeoutError if peer
               else ClosedError if trips.ended.endswith("was finished") else JobFailedError)
        raise _errors.make(cls, f"hetmesh connector ({c.role} {c.role_rank}): {failed} round "
                           f"trip(s) its device rang failed since the last check; the earliest "
                           f"reason kept: {why}", peer)


class DeviceAttention(_DeviceSide):
    """An A's sends and receives as its stream's rings and holds."""

    def __init__(self, connector):
        super().__init__(connector)
        e, c = self.engine, connector
        ffn = c.role_rank // c.ratio
        for stage in self.stages:
            e.arm_device(stage)
        # Views made once, before any capture: a DLPack import is no work for a graph.
        self.sent = {stage: as_tensor(e.tensor(stage, "tokens")) for stage in self.stages}
        self.logits = ({stage: as_tensor(e.tensor(stage, "router_logits"))
                        for stage in self.stages} if c._logits else None)
        self.results = {stage: as_tensor(e.result(stage, ffn)) for stage in self.stages}
        # stage -> {tensor address: (layout, rows armed)}; layout 0 is the slots'
        self.layouts = {stage: {} for stage in self.stages}
        torch = import_torch()
        self.capturing = (torch.cuda.is_current_stream_capturing if c._on_gpu
                          else lambda: True)
        self.rows = {}  # stage -> (rows rung, the tensor sent in place or None), until answered
        self.waiting = set()  # stages whose hold is enqueued (a host drain that timed out)

    def send(self, hidden_states, stage: int, rows: int, logits) -> None:
        if stage in self.rows:
            raise RuntimeError(f"hetmesh connector: stage {stage} sent again before its "
                               f"recv_ffn_output")
        if stage not in self.sent:
            raise ValueError(f"hetmesh connector: stage {stage}: the job has "
                             f"{len(self.stages)} (micro_batches)")
        layout = self._layout(hidden_states, stage, rows)
        if layout == 0:
            self.sent[stage][:rows].copy_(hidden_states)
        if logits is not None:
            self.logits[stage][:rows].copy_(logits)
        self.engine.enqueue_push_pull(stage, rows, self.stream(), layout)
        self.rows[stage] = (rows, hidden_states if layout else None)

    def _layout(self, tensor, stage: int, rows: int) -> int:
        """The layout that sends `tensor` in place (armed at its first sight, again where it
        brings more rows at that address), or 0: the slots. A layout is never given to another
        address: a captured graph rings it."""
        c = self.connector
        if self.logits is not None or rows == 0 or not c._fits(tensor):
            return 0
        known = self.layouts[stage]
        address = tensor.data_ptr()
        layout, armed_rows = known.get(address, (0, 0))
        if layout == 0:
            if len(known) + 1 >= AttentionEngine.MAX_DEVICE_LAYOUTS or not self.capturing():
                return 0
            layout = len(known) + 1
        if rows > armed_rows:
            self.engine.arm_device(stage, rows, send=tensor, results_into=tensor, layout=layout)
            known[address] = (layout, rows)
        return layout

    def receive(self, stage: int, ref_tensor):
        sent = self.rows.get(stage)
        if sent is None:
            raise RuntimeError(f"hetmesh connector: recv_ffn_output for stage {stage}, which has "
                               f"no send_attn_output before it")
        rows, in_place = sent
        if stage not in self.waiting:  # once: a second hold would wait for the next ring
            self.engine.enqueue_wait(stage, self.stream())
            self.waiting.add(stage)
        self.drain()  # on the host: one that times out can be called again
        self.waiting.discard(stage)
        del self.rows[stage]
        answer = in_place[:rows] if in_place is not None else self.results[stage][:rows]
        if ref_tensor is None:
            return answer if in_place is not None else answer.clone()
        if ref_tensor.data_ptr() != answer.data_ptr():
            ref_tensor[:rows].copy_(answer)
        return ref_tensor


class DeviceFfn(_DeviceSide):
    """An F's batches and answers as its stream's holds and rings."""

    def __init__(self, connector):
        super().__init__(connector)
        e, c = self.engine, connector
        e.serve_device()
        self.inputs = {stage: as_tensor(e.inputs(stage, "tokens")) for stage in self.stages}
        self.logits = ({stage: as_tensor(e.inputs(stage, "router_logits"))
                        for stage in self.stages} if c._logits else None)
        self.outputs = {stage: as_tensor(e.outputs(stage)) for stage in self.stages}
        self.counts = {}  # stage -> each A's rows, between its receive and its send

    def group_counts(self, stage: int) -> list:
        c = self.connector
        counts = c.control_plane._counts.get(stage)
        if counts is None or len(counts) != c.attn_size:
            raise ValueError(
                f"hetmesh connector (ffn {c.role_rank}): stage {stage} has no token counts for "
                f"{c.attn_size} attention ranks in this step's control payload (a device-"
                f"triggered F lays its batch out from them: update_state_from_dp_metadata first)")
        first = c.role_rank * c.ratio
        return counts[first:first + c.ratio]

    def _rows(self, whole, counts: list):
        """The As' rows of `whole` (a row space of windows) as one tensor."""
        if len(counts) == 1:
            return whole[:counts[0]]
        return import_torch().cat([whole[i * self.window:i * self.window + n]
                                   for i, n in enumerate(counts)])

    def receive(self, stage: int, with_logits: bool):
        if stage in self.counts:
            raise RuntimeError(f"hetmesh connector: recv_attn_output for stage {stage} again "
                               f"before its send_ffn_output")
        counts = self.group_counts(stage)
        self.engine.enqueue_wait_batch(stage, self.stream())
        self.drain()
        self.counts[stage] = counts
        hidden = self._rows(self.inputs[stage], counts)
        logits = self._rows(self.logits[stage], counts) if with_logits else None
        return hidden, counts, logits

    def respond(self, stage: int, ffn_output) -> None:
        counts = self.counts.get(stage)
        if counts is None:
            raise RuntimeError(f"hetmesh connector: send_ffn_output for stage {stage}, which has "
                               f"no recv_attn_output before it")
        if int(ffn_output.shape[0]) != sum(counts):
            raise ValueError(f"ffn_output shape {tuple(ffn_output.shape)} does not match the "
                             f"{sum(counts)} tokens received")
        out, start = self.outputs[stage], 0
        for i, n in enumerate(counts):  # one that raises leaves the batch to answer again
            out[i * self.window:i * self.window + n].copy_(ffn_output[start:start + n])
            start += n
        self.engine.enqueue_respond(stage, self.stream())
        del self.counts[stage]
