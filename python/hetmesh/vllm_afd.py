"""hetmesh as a connector of vLLM's AFD plugin (vllm-project/afd-plugin).

`AfdConnector` answers the plugin's connector contract (its docs/design/module/
connector_contracts.md: `init_afd_connector`, `close`, `is_initialized`, `send_attn_output`,
`recv_ffn_output`, `recv_attn_output`, `send_ffn_output`, and the control plane's
`update_state_from_dp_metadata`, `send_dp_metadata_list`, `recv_dp_metadata_list`) with one
hetmesh job of the plugin's mapping: F k serves As k*r ... k*r+r-1 and computes their full output
(`topology = "groups"`, r = attention / ffn). This module imports neither vLLM nor the plugin:
hetmesh.vllm wraps it in the plugin's base classes and registers it. Without them, the plugin's
payload objects are the plain classes below, with the same fields.

- Stages are the job's micro-batches: each (layer, stage) exchange is one round trip of that
  micro-batch; an A may send every stage before it receives any.
- An A sends from its hidden-states tensor and the F's answer lands in that very tensor, which is
  the `ref_tensor` the plugin's models pass to `recv_ffn_output`; an F responds from its own output
  tensor. Each allocation is registered once; a direction copies through hetmesh's slots instead
  (said once) where that costs less: its memory went through host staging, or tensors keep coming
  at new addresses (`max_buffers`). On a GPU, torch's current stream orders the engine's reads.
- The control plane rides the job's side band: the first A of each group sends its F the step's
  per-stage token counts, in order with the data that follows. From the same counts each A pushes
  its rows right after those of the As before it in its group, so the F gets its group's rows as
  one tensor, in place.
- Router logits travel beside the hidden states where the model computes the gate on the
  attention side (`router_logits_width`: the model's routed experts).
- With `device_trigger`, every call only enqueues work on the stream, so a CUDA graph captures it
  (hetmesh.vllm_afd_device); without it, a step under graph capture is refused by name.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import types as _types
from typing import Any

from . import _errors, vllm_afd_device
from ._in_place import InPlace
from ._streams import raw_current_stream
from . import (_native, AttentionEngine, ClosedError, FfnEngine, InvalidArgumentError, NotSupportedError,
               PeerLostError, ProtocolError, StoreServer, as_tensor, import_torch)

_log = logging.getLogger("hetmesh.vllm_afd")


# ---- the plugin's payload objects, where the plugin is not installed (same fields) ----

@dataclasses.dataclass
class DPMetadata:
    num_tokens_across_dp_cpu: Any  # int32 tensor: each DP rank's tokens for one stage
    max_tokens_across_dp_cpu: Any = None


@dataclasses.dataclass
class ControlPayload:
    dp_metadata_list: dict  # stage -> DPMetadata
    is_graph_capturing: bool = False
    is_warmup: bool = False


@dataclasses.dataclass
class TransferMetadata:
    layer_idx: int
    stage_idx: int
    seq_lens: list

    @property
    def total_tokens(self) -> int:
        return sum(self.seq_lens)


@dataclasses.dataclass
class TransferContext:
    metadata: TransferMetadata
    states: Any = None


@dataclasses.dataclass
class A2FPayload:
    hidden_states: Any
    context: TransferContext
    router_logits: Any = None


PLAIN_TYPES = _types.SimpleNamespace(
    dp_metadata=DPMetadata, control_payload=ControlPayload, transfer_metadata=TransferMetadata,
    transfer_context=TransferContext, a2f_payload=A2FPayload)


# ---- options (the plugin's connector_extra_config) ----

# Every option, its default and what it is. Unknown keys are refused with the nearest known one.
OPTIONS = {
    "store": ("", "host:port of the job's store (or an etcd URL); default the plugin's host:port"),
    "host_store": (True, "ffn 0 hosts the store at `store` (false: it is hosted elsewhere)"),
    "secret_file": ("", "the job's secret (needed where the store listens beyond loopback)"),
    "job": ("vllm-afd", "the job's namespace in its store"),
    "device": ("cuda:{local_rank}", "this instance's device; {local_rank} is filled in"),
    "transport": ("", "ipc, tcp, verbs or fabric (default: the job's default)"),
    "listen_host": ("", "the address this instance's transport listens on"),
    "micro_batches": (2, "the most stages a step has (vLLM's ubatches)"),
    "timeout_ms": (60000, "the bound of every wait for a peer's data"),
    "join_timeout_ms": (1800000, "how long an instance waits for the others to start"),
    "max_buffers": (64, "new allocations registered per direction before copying through slots"),
    "router_logits_width": (0, "router logits a token (the model's routed experts; 0: none)"),
    "router_logits_dtype": ("", "their dtype (default: the hidden states')"),
    "device_trigger": (False, "every round trip rung and waited for by the device's stream, "
                              "capturable in CUDA graphs (hetmesh.vllm: on unless enforce_eager)"),
}


def parse_options(raw) -> dict:
    """The connector's options from the plugin's connector_extra_config, defaults filled in."""
    import difflib

    if raw is not None and not isinstance(raw, dict):
        raise TypeError(f"hetmesh connector_extra_config: expected a mapping, got {raw!r}")
    options = {name: default for name, (default, _) in OPTIONS.items()}
    for key, value in (raw or {}).items():
        if key not in OPTIONS:
            near = difflib.get_close_matches(key, OPTIONS, n=1)
            raise ValueError(f"hetmesh connector_extra_config: unknown key {key!r}"
                             f"{f' (did you mean {near[0]!r}?)' if near else ''}; known: "
                             f"{', '.join(sorted(OPTIONS))}")
        if type(value) is not type(OPTIONS[key][0]):
            raise TypeError(f"hetmesh connector_extra_config: {key}={value!r}: expected "
                            f"{type(OPTIONS[key][0]).__name__}")
        options[key] = value
    return options


_NO_ROUTER_LOGITS = ("hetmesh connector: router_logits travel only where the job declares them: "
                     "set connector_extra_config's router_logits_width (the model's routed "
                     "experts), or the plugin's compute_gate_on_attention = false")

_WIRE_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _wire_dtype(dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _WIRE_DTYPES:
        raise _errors.make(
            NotSupportedError,
            f"hetmesh connector: hidden states of {dtype} cannot travel; "
            f"bfloat16, float16 and float32 can")
    return _WIRE_DTYPES[name]


class AfdConnector:
    """One instance of the job: role "attention" or "ffn", its rank in that role."""

    def __init__(self, *, role: str, role_rank: int, attention: int, ffn: int, hidden: int,
                 dtype, max_tokens: int, local_rank: int = 0, default_store: str = "",
                 options: dict | None = None, types=PLAIN_TYPES):
        if role not in ("attention", "ffn"):
            raise _errors.make(
                InvalidArgumentError,
                f"hetmesh connector: role {role!r} is not attention or ffn")
        if ffn < 1 or attention < ffn or attention % ffn:
            raise _errors.make(
                InvalidArgumentError,
                f"hetmesh connector: {attention} attention ranks do not divide among {ffn} FFN "
                f"ranks (the plugin's mapping gives each F the same number of As)")
        self.role, self.role_rank = role, role_rank
        self.attn_size, self.ffn_size = attention, ffn
        self.ratio = attention // ffn
        self.options = parse_options(options)
        self.types = types
        self.device = self.options["device"].format(local_rank=local_rank)
        self._on_gpu = not self.device.startswith("cpu")
        self._raw_stream = None  # raw_current_stream(), at the first tensor on a GPU
        self.store_address = self.options["store"] or default_store
        # No routing travels (the F computes the gate, or gets the router logits); batches wait
        # for every A of the group (vLLM's ranks step together; a partial batch is no stage).
        self.job = dict(attention=attention, ffn=ffn, topology="groups",
                        micro_batches=self.options["micro_batches"], tokens=max_tokens,
                        hidden=hidden, experts=ffn, top_k=0, a2f_dtype=_wire_dtype(dtype),
                        f2a_dtype=_wire_dtype(dtype), timeout_ms=self.options["timeout_ms"],
                        gather_window_ms=self.options["timeout_ms"],
                        join_timeout_ms=self.options["join_timeout_ms"])
        self._logits = None  # (width, torch dtype name) of the router logits that travel
        if self.options["router_logits_width"] > 0:
            logits_dtype = self.options["router_logits_dtype"] or str(dtype)
            self._logits = (self.options["router_logits_width"],
                            logits_dtype.removeprefix("torch."))
            self.job["a2f_tensors"] = {"router_logits": self._logits[::-1]}
        for key in ("transport", "listen_host"):
            if self.options[key]:
                self.job[key] = self.options[key]
        self.control_plane = ControlPlane(self)
        self._engine = None
        self._store = None
        # Each side's per layer in C++: an A's sends (_native._ConnectorAttention, which keeps
        # every send: stage -> (handle, tensor, rows, in place, router logits)), an F's batches and
        # answers (_native._ConnectorFfn); and the tensors first used in place (stage -> tensor),
        # until the engine's staged bytes say how they went.
        self._attn = None
        self._ffn = None
        self._device = None  # with device_trigger: vllm_afd_device's side, all the way
        self._rows_view = None
        self._probing: dict[int, Any] = {}
        limit = self.options["max_buffers"]
        def staged() -> int:
            return self.engine.counters()["staged_bytes"]

        def buffers(what: str) -> InPlace:
            return InPlace(_log, "hetmesh connector", what, limit, "max_buffers", staged)

        self._a2f = buffers("the hidden states sent")
        self._f2a = buffers("the FFN output")
        self._gate = buffers("the router logits sent")
        self._dtype = dtype
        self._said = set()
        # (stage, name) -> a view made once: an F's row spaces, an A's slots
        self._views = {}

    # ---- lifecycle ----

    def init_afd_connector(self) -> None:
        """Joins the job (blocking until every instance of the job is in it). Idempotent."""
        if self._engine is not None:
            return
        if not self.store_address:
            raise _errors.make(
                InvalidArgumentError,
                "hetmesh connector: no store address (the plugin's host:port "
                "or connector_extra_config's store)")
        secret_file = self.options["secret_file"] or os.environ.get("HETMESH_JOB_SECRET_FILE", "")
        hosts = (self.role == "ffn" and self.role_rank == 0 and self.options["host_store"]
                 and "://" not in self.store_address)
        if hosts:
            self._store = StoreServer(self.store_address, secret_file or None)
        engine = AttentionEngine if self.role == "attention" else FfnEngine
        try:
            self._engine = engine(rank=self.role_rank, store=self.store_address,
                                  secret_file=secret_file, device=self.device,
                                  job=self.options["job"], **self.job)
            if self.options["device_trigger"]:
                self._device = (vllm_afd_device.DeviceAttention if self.role == "attention"
                                else vllm_afd_device.DeviceFfn)(self)
            elif self.role == "attention":
                self._attn = _native._ConnectorAttention(
                    self._engine, raw_current_stream() if self._on_gpu else None)
                self.control_plane.to_native()
            else:
                self._rows_view = _row_views(self._engine, self._views)
                self._ffn = _native._ConnectorFfn(
                    self._engine, self.role_rank, self._rows_view,
                    raw_current_stream() if self._on_gpu else None)
        except BaseException:
            if self._engine is not None:
                self._engine.close()
                self._engine = None
            if self._store is not None:
                self._store.close()
                self._store = None
            raise

    @property
    def is_initialized(self) -> bool:
        return self._engine is not None and not self._engine.closed

    @property
    def engine(self):
        if self._engine is None or self._engine.closed:
            raise _errors.make(
                ClosedError,
                f"hetmesh connector ({self.role} {self.role_rank}): not initialized "
                "(init_afd_connector) or closed")
        return self._engine

    def close(self) -> None:
        """Leaves the job: an A's F hears it left (not that it died). Safe to call again, and after
        a failed or partial initialization."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()  # first: it may still read and write the tensors the sides keep
        self._probing.clear(), self._views.clear()
        self._device = None
        for side in (self._attn, self._ffn):
            if side is not None:
                side.close()
        self._attn = self._ffn = None
        if self._store is not None:
            self._store.close()
            self._store = None

    def _group_left(self):
        return _errors.make(ClosedError, f"hetmesh connector (ffn {self.role_rank}): every "
                            f"attention instance of its group has left")

    def counters(self) -> dict:
        """Bytes moved from and into the application's tensors and hetmesh's slots; the layers
        that went without Python: an A's sends and receives (sends_from_cpp, receives_from_cpp),
        an F's batches and answers (batches_from_cpp, answers_from_cpp)."""
        counters = self.engine.counters()
        for side in (self._attn, self._ffn):
            if side is not None:
                counters.update(side.counters())
        return counters

    def check_round_trips(self) -> None:
        """With device_trigger: raises the first round trip its device rang that failed since the
        last check (a peer lost: PeerLostError naming it), whose stream went on with stale rows.
        The control plane checks at each step; a runner that synchronizes its stream can check
        before it uses a step's output. Without device_trigger every call raises its own."""
        if self._device is not None:
            self._device.check()

    def _side(self, role: str, call: str):
        """This instance's per-layer state in C++ for `call`, one of `role`'s; raises where not
        initialized, closed, or of the other role."""
        self.engine
        if role != self.role:
            raise RuntimeError(f"hetmesh connector: {call} on an {self.role} instance")
        return self._attn if role == "attention" else self._ffn

    # ---- the attention side ----

    def send_attn_output(self, hidden_states, context, **kwargs) -> None:
        """Sends one (layer, stage) of hidden states (and the layer's router logits, where the
        gate ran here) to this A's F; returns at once."""
        if (not kwargs and self._logits is None and self._attn is not None
                and self._attn.send(hidden_states, context.metadata)):
            return  # in place, from memory sent from before (a job of router logits: below)
        logits = None
        if kwargs:
            _refuse_extras(kwargs, "send_attn_output")
            logits = kwargs.get("router_logits")
            if logits is not None and self._logits is None:
                raise _errors.make(NotSupportedError, _NO_ROUTER_LOGITS)
        engine = self.engine
        metadata = context.metadata
        rows = int(hidden_states.shape[0])
        if rows != metadata.total_tokens:
            raise ValueError(f"hidden_states shape {tuple(hidden_states.shape)} does not match "
                             f"the transfer's token count {metadata.total_tokens}")
        stage = int(metadata.stage_idx)
        if self._device is not None:
            if logits is not None:
                self._check_logits(logits, rows)
            self._side("attention", "send_attn_output")
            self.control_plane.row_offset(stage, rows)  # refuses rows that are not the counts'
            self._device.send(hidden_states, stage, rows, logits)
            return
        if self._side("attention", "send_attn_output").sent(stage) is not None:
            raise RuntimeError(f"hetmesh connector: stage {stage} sent again before its "
                               f"recv_ffn_output")
        push = dict(stream=self._stream_of(hidden_states),
                    row_offset=self.control_plane.row_offset(stage, rows))
        if self._logits is not None:
            push["rows"] = {"router_logits": 0 if logits is None else rows}
        if logits is not None:
            self._check_logits(logits, rows)
            if self._fits(logits, logits.dtype) and self._gate.use(logits, stage):
                push["tensors"] = {"router_logits": logits}
            else:
                self._slot(stage, "router_logits")[:rows].copy_(logits)
        if self._fits(hidden_states) and self._a2f.use(hidden_states, stage):
            handle = engine.push_pull(stage, rows, send=hidden_states, results_into=hidden_states,
                                      **push)
            self._attn.put(stage, (handle, hidden_states, rows, True, logits))
            if self._logits is not None:
                return
            if stage in self._a2f.probes:
                self._probing[stage] = hidden_states  # learnt once its first answer settles
            else:
                self._attn.learn(hidden_states)
            return
        self._slot(stage, "tokens")[:rows].copy_(hidden_states)
        handle = engine.push_pull(stage, rows, **push)
        # The tensors sent in place are held until the answer is in: the model drops its router
        # logits at once, and their memory must not be reused while the engine reads it.
        self._attn.put(stage, (handle, hidden_states, rows, False, logits))

    def _slot(self, stage: int, name: str):
        """A view of one of the engine's slots (an A's send slot of a tensor, or "result"), made
        once: a DLPack import costs ~20 us on a GPU, a slice of a view made before nothing."""
        key = (stage, name)
        view = self._views.get(key)
        if view is None:
            engine = self.engine
            slot = (engine.result(stage, self.role_rank // self.ratio) if name == "result"
                    else engine.tensor(stage, name))
            view = self._views[key] = as_tensor(slot)
        return view

    def _check_logits(self, logits, rows: int) -> None:
        width, dtype = self._logits
        if tuple(logits.shape) != (rows, width) or str(logits.dtype) != f"torch.{dtype}":
            raise ValueError(f"hetmesh connector: router_logits {tuple(logits.shape)} "
                             f"{logits.dtype}, and the job carries [{rows}, {width}] {dtype} "
                             f"(router_logits_width, router_logits_dtype)")

    def recv_ffn_output(self, ref_tensor, ubatch_idx: int = 0, **kwargs):
        """Waits for the F's answer to stage `ubatch_idx` and returns it in `ref_tensor`. A wait
        that times out can be called again."""
        if self._attn is not None and not (self._a2f.probes or self._gate.probes):
            answer = self._attn.receive(ubatch_idx, ref_tensor)
            if answer is not None:
                return answer  # in place, and in ref_tensor where one was given
        if self._device is not None:
            self._side("attention", "recv_ffn_output")
            return self._device.receive(int(ubatch_idx), ref_tensor)
        engine = self.engine
        entry = self._side("attention", "recv_ffn_output").sent(ubatch_idx)
        if entry is None:
            raise RuntimeError(f"hetmesh connector: recv_ffn_output for stage {ubatch_idx}, which "
                               f"has no send_attn_output before it")
        handle, sent, rows, in_place, _ = entry
        try:
            engine.wait(handle)
        except TimeoutError:
            raise  # still in flight: the same call may wait for it again
        except BaseException:
            self._attn.pop(ubatch_idx)
            raise
        self._attn.pop(ubatch_idx)
        self._settle(self._a2f, ubatch_idx, self._attn)
        self._gate.settle(ubatch_idx)
        if in_place:
            answer = sent
        else:
            answer = self._slot(ubatch_idx, "result")[:rows]
        if ref_tensor is None:
            return answer if in_place else answer.clone()
        if ref_tensor.data_ptr() != answer.data_ptr() or ref_tensor.shape[0] != rows:
            ref_tensor[:rows].copy_(answer)
        return ref_tensor

    def _stream_of(self, tensor):
        """torch's current stream where `tensor` is on a GPU, so that what wrote it is done
        before the engine reads it; None on the host. A stream object where the tensor is on
        another GPU than the engine's, which the engine refuses by name."""
        if not tensor.is_cuda:
            return None
        index = tensor.get_device()
        if self.device != f"cuda:{index}":
            return import_torch().cuda.current_stream(index)
        if self._raw_stream is None:
            self._raw_stream = raw_current_stream()
        return self._raw_stream(index)

    def _fits(self, tensor, dtype=None) -> bool:
        """Whether the engine can use `tensor` in place: C order, the job's dtype, its device."""
        return (tensor.is_cpu != self._on_gpu and tensor.dtype == (dtype or self._dtype)
                and tensor.is_contiguous())

    # ---- the FFN side ----

    def recv_attn_output(self, ubatch_idx: int = 0, **kwargs):
        """Stage `ubatch_idx` from every A of this F's group, as one [sum of rows, hidden] tensor
        (the As' rows in rank order, in place where they landed back to back), with their router
        logits where the layer's `routing_spec` asks for them. In place, it is a view of the
        engine's rows, the same tensor object for the same stage and row count at every layer:
        read it before send_ffn_output, and do not reshape it in place."""
        spec = None
        if kwargs:
            _refuse_extras(kwargs, "recv_attn_output", allowed=("routing_spec",))
            spec = kwargs.get("routing_spec")
        if spec is not None and (self._logits is None or (
                int(spec.router_logits_width), str(spec.router_logits_dtype)) !=
                (self._logits[0], f"torch.{self._logits[1]}")):
            raise _errors.make(NotSupportedError, f"{_NO_ROUTER_LOGITS} (the layer asks for "
                               f"{spec.router_logits_width} {spec.router_logits_dtype})")
        ffn = self._side("ffn", "recv_attn_output")
        t = self.types
        if self._device is not None:
            hidden_states, seq_lens, logits = self._device.receive(int(ubatch_idx),
                                                                   spec is not None)
            payload = t.a2f_payload(
                hidden_states=hidden_states,
                context=t.transfer_context(metadata=t.transfer_metadata(
                    layer_idx=0, stage_idx=ubatch_idx, seq_lens=seq_lens)))
            if spec is not None:
                payload.router_logits = logits
            return payload
        got = ffn.receive(ubatch_idx, None)
        if got is None:
            raise self._group_left()
        if self._f2a.probes:
            # the last answer of this stage has reached its As
            self._settle(self._f2a, ubatch_idx, ffn)
        try:
            if type(got) is tuple:  # packed: its rows in place, and each A's count
                hidden_states, seq_lens = got
                batch = ffn.batch(ubatch_idx) if spec is not None else None
            else:
                batch = got
                parts = batch.parts
                if len(parts) > 1:
                    parts = sorted(parts, key=lambda part: part.rank)
                seq_lens = [part.count for part in parts]
                hidden_states = self._whole(batch, "tokens")
            if len(seq_lens) != self.ratio:
                self._raise_lost_attention()
            payload = t.a2f_payload(
                hidden_states=hidden_states,
                context=t.transfer_context(metadata=t.transfer_metadata(
                    layer_idx=0, stage_idx=ubatch_idx, seq_lens=seq_lens)))
            if spec is not None:
                payload.router_logits = self._whole(batch, "router_logits")
        except BaseException:
            ffn.take(ubatch_idx)  # refused: not open (as if never received)
            raise
        return payload

    def _raise_lost_attention(self) -> None:
        """A batch short of its group's As: raises PeerLostError naming one of them that was
        lost (the engine served on without it; vLLM's data-parallel ranks step together, so a
        stage without one is no stage). A batch short of an A that left is served."""
        group = range(self.role_rank * self.ratio, (self.role_rank + 1) * self.ratio)
        for p in self.engine.peers():
            if p["rank"] in group and p["state"] == "lost":
                raise _errors.make(PeerLostError, p["reason"] or f"attention {p['rank']} lost",
                                   f"attention:{p['rank']}")  # the reason names it

    def _settle(self, in_place: InPlace, stage: int, side) -> None:
        """The first exchange of `stage` from an allocation has moved its bytes: did they go
        through host staging? Where they did not, such exchanges go in place from C++ (`side`)
        from now on; where they did, C++ forgets what it learnt (another stage's tensor in the
        same allocation may have been learnt meanwhile)."""
        if in_place.settle(stage):
            side.forget()
        tensor = self._probing.pop(stage, None)
        if tensor is not None and in_place.use(tensor):
            side.learn(tensor)

    def _whole(self, batch, name: str):
        """A tensor of the batch as one: in place where its As pushed back to back (the control
        plane's counts), else their rows, in rank order, copied together (said once)."""
        parts = sorted(batch.parts, key=lambda part: part.rank)
        if name != "tokens" and any(part.count and not part.rows(name) for part in parts):
            raise _errors.make(
                ProtocolError,
                f"hetmesh connector (ffn {self.role_rank}): the layer asks for {name}, and "
                f"attention {next(p.rank for p in parts if p.count and not p.rows(name))} sent "
                f"none with its hidden states (the gate ran on one side only?)")
        if batch.packed:
            return self._rows_view(batch.micro_batch, batch.count, name)
        rows = [as_tensor(part.tokens if name == "tokens" else part.tensor(name))
                for part in parts]
        if len(rows) == 1:
            return rows[0]
        if "unpacked" not in self._said:
            self._said.add("unpacked")
            _log.warning("hetmesh connector (ffn %d): the As' rows did not land back to back "
                         "(their token counts differ from the control plane's?); copying them "
                         "together", self.role_rank)
        return import_torch().cat(rows)

    def send_ffn_output(self, ffn_output, context, **kwargs) -> None:
        """Sends each A of the group its rows of `ffn_output` (in the order received)."""
        stage = int(context.metadata.stage_idx)
        if self._ffn is not None and self._ffn.respond(stage, ffn_output):
            return  # in place, from memory answered from before
        if self._device is not None:
            self._side("ffn", "send_ffn_output")
            self._device.respond(stage, ffn_output)
            return
        engine = self.engine
        batch = self._side("ffn", "send_ffn_output").take(stage)
        if batch is None:
            raise RuntimeError(f"hetmesh connector: send_ffn_output for stage {stage}, which has "
                               f"no recv_attn_output before it")
        total = batch.count if batch.packed else sum(part.count for part in batch.parts)
        if int(ffn_output.shape[0]) != total:
            raise ValueError(f"ffn_output shape {tuple(ffn_output.shape)} does not match the "
                             f"{total} tokens received")
        stream = self._stream_of(ffn_output)
        if not (self._fits(ffn_output) and self._f2a.use(ffn_output, stage)):
            rows = self._rows_by_rank(batch, ffn_output)
            for part in batch.parts:
                as_tensor(part.output)[:part.count].copy_(rows[part.rank])
            engine.respond(batch, stream=stream)
            return
        if batch.packed:
            outputs = ffn_output  # its rows are the parts' in order, each at its row offset
        else:
            rows = self._rows_by_rank(batch, ffn_output)
            outputs = [rows[part.rank] for part in batch.parts]
        engine.respond(batch, stream=stream, outputs=outputs)
        self._ffn.hold(stage, ffn_output)  # the engine reads it after this returns
        if stage in self._f2a.probes:
            self._probing[stage] = ffn_output  # learnt once its first answer settles
        else:
            self._ffn.learn(ffn_output)

    @staticmethod
    def _rows_by_rank(batch, ffn_output) -> dict:
        """Each A's rows of `ffn_output`, which holds them in rank order."""
        rows, start = {}, 0
        for part in sorted(batch.parts, key=lambda part: part.rank):
            rows[part.rank] = ffn_output[start:start + part.count]
            start += part.count
        return rows


def _row_views(engine, views: dict):
    """A function giving the first `count` rows of `engine`'s row space of a stage's tensor (a
    packed batch starts at row 0: the connector names no receive buffers of its own), from a
    view of the whole made once (kept in `views`): a DLPack import costs ~20 us on a GPU. It
    holds no connector, which holds it (through its C++ part, out of the collector's sight)."""
    def rows_view(stage: int, count: int, name: str = "tokens"):
        whole = views.get((stage, name))
        if whole is None:
            whole = views[stage, name] = as_tensor(engine.inputs(stage, name))
        return whole[:count]
    return rows_view


def _refuse_extras(kwargs: dict, call: str, allowed=("router_logits",)) -> None:
    """Keyword arguments a model passes that this connector does not carry are refused, not
    dropped (top-k ids and weights: the plugin's models send router logits instead)."""
    extra = sorted(k for k, v in kwargs.items() if k not in allowed and v is not None)
    if extra:
        raise _errors.make(NotSupportedError, f"hetmesh connector: {call} cannot carry "
                           f"{', '.join(extra)}; the router logits (router_logits_width) can")


class ControlPlane:
    """The plugin's AFDControlPlane: each step's per-stage token counts, from the first A of each
    group to its F over the job's side band."""

    def __init__(self, connector: AfdConnector):
        self.connector = connector
        self.payload = None
        self._counts = {}  # stage -> every DP rank's tokens this step

    def row_offset(self, stage: int, rows: int):
        """Where this A's rows of `stage` go in its F's batch: after those of the As before it in
        its group, by this step's counts (None, its own window, where no counts came). Rows that
        are not what the counts say are refused: the group's other As push at the offsets the
        counts give, and this A's rows would land over theirs."""
        c = self.connector
        counts = self._counts.get(stage)
        if counts is None:
            return None
        if len(counts) != c.attn_size or counts[c.role_rank] != rows:
            raise ValueError(
                f"hetmesh connector (attention {c.role_rank}): stage {stage} sends {rows} rows, "
                f"but this step's control payload gives {len(counts)} counts "
                f"{counts if len(counts) <= 16 else '...'} for {c.attn_size} attention ranks "
                f"(this rank's: {counts[c.role_rank] if c.role_rank < len(counts) else 'none'}); "
                f"the F lays its group's rows out from those counts")
        first = c.role_rank - c.role_rank % c.ratio
        return sum(counts[first:c.role_rank])

    def update_state_from_dp_metadata(self, payload) -> None:
        """This step's counts; with device_trigger, first raises a round trip of the steps
        before that failed (their streams went on)."""
        c = self.connector
        if c._device is not None:
            c._device.check()
        elif payload.is_graph_capturing:
            raise _errors.make(
                NotSupportedError,
                "hetmesh connector: a step under CUDA graph capture needs device-triggered round "
                "trips: set connector_extra_config's device_trigger (hetmesh.vllm does unless "
                "enforce_eager)")
        self.payload = payload
        self._counts = {
            int(stage): [int(n) for n in m.num_tokens_across_dp_cpu.flatten().tolist()]
            for stage, m in payload.dp_metadata_list.items()
        }
        self.to_native()

    def to_native(self) -> None:
        """An A's rows and row offset per stage, for its sends from C++ (counts that do not fit
        the job as (-1, 0): such a send goes to row_offset, which refuses it)."""
        c = self.connector
        if c._attn is None:
            return
        first = c.role_rank - c.role_rank % c.ratio
        c._attn.set_offsets({
            stage: (counts[c.role_rank], sum(counts[first:c.role_rank]))
            if len(counts) == c.attn_size else (-1, 0)
            for stage, counts in self._counts.items()})

    def send_dp_metadata_list(self, payload) -> None:
        c = self.connector
        if c.role != "attention" or c.role_rank % c.ratio:
            return  # one A of each group speaks for it
        stages = {
            str(int(stage)): [int(n) for n in m.num_tokens_across_dp_cpu.flatten().tolist()]
            for stage, m in payload.dp_metadata_list.items()
        }
        message = {"stages": stages, "capturing": bool(payload.is_graph_capturing),
                   "warmup": bool(payload.is_warmup), "device": c._device is not None}
        c.engine.send_message(c.role_rank // c.ratio,
                              json.dumps(message, separators=(",", ":")).encode())

    def recv_dp_metadata_list(self):
        """The next step's payload from this F's group; raises ClosedError once its As have all
        left, PeerLostError naming an A of the group that died: at once, though its group-mates
        still send (vLLM's data-parallel ranks step together, so a step without one is no step)."""
        c = self.connector
        engine = c.engine
        group = range(c.role_rank * c.ratio, (c.role_rank + 1) * c.ratio)
        if c._device is not None:
            c._device.check()
        while True:
            c._raise_lost_attention()
            got = engine.receive_message(timeout_ms=200)
            if got is not None:
                return self._decode(got)
            states = [p["state"] for p in engine.peers() if p["rank"] in group]
            if states and all(state == "left" for state in states):
                raise c._group_left()

    def _decode(self, message):
        role, rank, data = message
        torch = import_torch()
        try:
            body = json.loads(data)
            stages = {int(stage): [int(n) for n in counts]
                      for stage, counts in body["stages"].items()}
            capturing, warmup = bool(body["capturing"]), bool(body["warmup"])
            device = bool(body["device"])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise _errors.make(
                ProtocolError,
                f"hetmesh connector: {role} {rank} sent a control message "
                f"that is not one: {e}")
        if device != (self.connector._device is not None):
            # The rows' layout differs: packed at the counts' offsets, or each A in its window.
            raise _errors.make(
                ProtocolError,
                f"hetmesh connector (ffn {self.connector.role_rank}): {role} {rank} runs with "
                f"device_trigger {'on' if device else 'off'}, this F with it "
                f"{'off' if device else 'on'}; every instance of a job runs the same (vLLM: the "
                f"same enforce_eager)")
        t = self.connector.types
        return t.control_payload(
            dp_metadata_list={
                stage: t.dp_metadata(
                    num_tokens_across_dp_cpu=torch.tensor(counts, dtype=torch.int32))
                for stage, counts in stages.items()
            },
            is_graph_capturing=capturing, is_warmup=warmup)
