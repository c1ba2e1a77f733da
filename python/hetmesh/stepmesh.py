"""StepMesh's Python API (`import fserver_lib as f`) on hetmesh's engines (docs/stepmesh.md).

Roles from DMLC_ROLE: the scheduler hosts the job's store at DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT, a
server is an FFN instance (F), a worker an attention instance (A). Ranks follow StepMesh's: with
DMLC_GROUP_SIZE instances a node, instance i of worker node n is A n*G+i and talks to instance i of
every server node (StepMesh's rails), each of which answers it into a pull tensor of its own.

Every push_pull is one round trip of the job's "bytes" layout: each push tensor travels as its
bytes, from the caller's tensor in place, and each server's answer lands in the caller's pull
tensor in place (hetmesh registers each allocation once). What a push's tensors are (keys,
dtypes, shapes but the first dimension) is said once per distinct layout on the engines' side
band, in order with the data; after that a push carries only a number for it. The F gives back
views of the bytes where they landed, with the push's dtypes and shapes.

Differences from StepMesh, none silent: errors are raised (hetmesh.Error subclasses naming the
peer) where StepMesh aborted; one pull tensor per server; the n-th push_pull of every worker
makes up one batch (StepMesh's get_batch takes each worker's oldest push alike); an F holds at
most HETMESH_STEPMESH_MICRO_BATCHES batches unanswered; register_recv_buffer is accepted and not
needed (every push lands in memory registered at init).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import operator
import os
import time
from typing import Any

import hetmesh
from . import _errors
from ._streams import raw_current_stream
from ._in_place import InPlace
from ._errors import InvalidArgumentError, NotSupportedError

_log = logging.getLogger("hetmesh.stepmesh")

# ---- the environment ----

# StepMesh's variables this module reads.
_READ = ("DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
         "DMLC_NODE_RANK", "DMLC_GROUP_SIZE", "DMLC_RANK_OFFSET", "DMLC_INSTANCE_ID", "STEPMESH_GPU",
         "DMLC_NODE_HOST", "DMLC_ENABLE_RDMA")
# StepMesh's variables that mean nothing here: said once, at init.
_IGNORED = ("DMLC_INTERFACE", "STEPMESH_BAKCEND", "STEPMESH_BACKEND", "STEPMESH_MEM_SYNC",
            "STEPMESH_SPLIT_QP_LAG", "STEPAF_QP_NUM", "STEPMESH_BIND_CPU_CORE",
            "STEPMESH_CPU_CORES_PER_SOCKET", "STEPMESH_CPU_CORES_PER_GPU",
            "STEPMESH_CPU_START_OFFSET", "STEPMESH_DROP_RATE", "STEPMESH_ENABLE_TRACE",
            "BYTEPS_RDMA_RX_DEPTH", "BYTEPS_RDMA_START_DEPTH", "BYTEPS_RDMA_MAX_CONCURR_WR",
            "PS_VERBOSE")
# hetmesh's own, with their defaults: sizes every instance of the job must agree on.
SETTINGS = {
    "HETMESH_STEPMESH_MAX_BYTES": (8 << 20, "the most bytes of one push or pull tensor"),
    "HETMESH_STEPMESH_TENSORS": (4, "the most push tensors of one push_pull (1..7)"),
    "HETMESH_STEPMESH_MICRO_BATCHES": (3, "push_pulls a worker may have in flight before the "
                                       "F answered the oldest: the F's buffers, one set each"),
    "HETMESH_STEPMESH_MAX_BUFFERS": (64, "allocations a direction uses in place before it copies "
                                     "through hetmesh's own buffers (tensors new every call)"),
}
# [section] key of HETMESH_CONFIG this module sets itself from StepMesh's variables.
_OWN_KEYS = {"attention", "ffn", "micro_batches", "queue_depth", "topology", "ffns_of", "gather",
             "tokens", "hidden", "experts", "top_k", "a2f_dtype", "f2a_dtype", "a2f_tensors"}


def _integer(name: str, default=None, low: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise _errors.make(InvalidArgumentError, f"fserver_lib.init: {name} is not set")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _errors.make(InvalidArgumentError,
                           f"fserver_lib.init: {name}={raw!r} is not an integer") from None
    if value < low:
        raise _errors.make(InvalidArgumentError,
                           f"fserver_lib.init: {name}={value} is below {low}")
    return value


class _Environment:
    """StepMesh's variables, read once by init()."""

    def __init__(self):
        self.role = os.environ.get("DMLC_ROLE", "server")
        if self.role not in ("scheduler", "server", "worker"):
            raise _errors.make(InvalidArgumentError,
                               f"fserver_lib.init: DMLC_ROLE={self.role!r}: expected scheduler, "
                               f"server or worker (joint is not supported)")
        self.workers = _integer("DMLC_NUM_WORKER", 1, 1)
        self.servers = _integer("DMLC_NUM_SERVER", 1, 1)
        self.group_size = _integer("DMLC_GROUP_SIZE", 1, 1)
        self.node_rank = _integer("DMLC_NODE_RANK", 0)
        self.gpu = _integer("STEPMESH_GPU", 0)
        self.instance = _integer("DMLC_INSTANCE_ID", self.gpu + _integer("DMLC_RANK_OFFSET", 0))
        host = os.environ.get("DMLC_PS_ROOT_URI") or "127.0.0.1"
        self.store = f"{host}:{_integer('DMLC_PS_ROOT_PORT')}"
        self.node_host = os.environ.get("DMLC_NODE_HOST", "")
        self.rdma = os.environ.get("DMLC_ENABLE_RDMA", "").lower() in ("ibverbs", "1", "true")
        self.settings = {name: _integer(name, default, 1)
                         for name, (default, _) in SETTINGS.items()}
        if self.role != "scheduler":
            nodes = self.workers if self.role == "worker" else self.servers
            if self.instance >= self.group_size or self.node_rank >= nodes:
                raise _errors.make(
                    InvalidArgumentError,
                    f"fserver_lib.init: a {self.role} at DMLC_NODE_RANK={self.node_rank}, instance "
                    f"{self.instance} (DMLC_INSTANCE_ID, else STEPMESH_GPU + DMLC_RANK_OFFSET), "
                    f"and the job has {nodes} node(s) of DMLC_GROUP_SIZE={self.group_size}")
        ignored = sorted(name for name in _IGNORED if name in os.environ)
        if ignored:
            _log.info("fserver_lib: hetmesh ignores %s (docs/stepmesh.md says why)",
                      ", ".join(ignored))

    @property
    def rank(self) -> int:
        return self.node_rank * self.group_size + self.instance

    def config(self) -> hetmesh.Config:
        """The job: As and Fs by rail, the "bytes" layout, and HETMESH_CONFIG's other settings."""
        tensors = self.settings["HETMESH_STEPMESH_TENSORS"]
        if tensors > 7:
            raise _errors.make(InvalidArgumentError,
                               f"fserver_lib.init: HETMESH_STEPMESH_TENSORS={tensors}: at most 7")
        # Each tensor starts on a 256-byte boundary in the F's rows (any dtype's view is aligned).
        max_bytes = -(-self.settings["HETMESH_STEPMESH_MAX_BYTES"] // 256) * 256
        g = self.group_size
        ffns_of = [[s * g + a % g for s in range(self.servers)] for a in range(self.workers * g)]
        job = dict(attention=self.workers * g, ffn=self.servers * g,
                   micro_batches=self.settings["HETMESH_STEPMESH_MICRO_BATCHES"],
                   topology="map", ffns_of=ffns_of, gather="all", queue_depth=1,
                   tokens=max_bytes, hidden=1,
                   experts=self.servers * g, top_k=0, a2f_dtype="fp8", f2a_dtype="fp8",
                   a2f_tensors={f"push{i}": ("fp8", 1) for i in range(1, tensors)})
        job.update(_config_file_settings())
        if self.rdma and "transport" not in job:
            job["transport"] = "verbs"
        if self.node_host and "listen_host" not in job:
            job["listen_host"] = self.node_host
        # StepMesh waits for its peers without a bound (init, get_batch's every worker); here ten
        # minutes, as processes that load a model start minutes apart: a worker later than that
        # is served without. A write whose bytes stop moving is still found in 10 s, a hung peer
        # by the heartbeat.
        job.setdefault("timeout_ms", 600000)
        job.setdefault("join_timeout_ms", job["timeout_ms"])
        job.setdefault("gather_window_ms", job["timeout_ms"])
        job.setdefault("io_timeout_ms", 10000)
        return hetmesh.config(**job)


def _config_file_settings() -> dict:
    """HETMESH_CONFIG's settings as the package's keywords; those StepMesh's variables set here
    are refused by name."""
    path = os.environ.get("HETMESH_CONFIG")
    if not path:
        return {}
    import tomllib

    with open(path, "rb") as file:
        table = tomllib.load(file)
    keyword_of = {key: name for name, key in hetmesh._KEYS.items()}
    settings = {}
    for section, values in table.items():
        for key, value in (values.items() if isinstance(values, dict) else [(None, values)]):
            name = keyword_of.get((section, key))
            if name is None or name in _OWN_KEYS:
                why = ("set from StepMesh's variables here" if name in _OWN_KEYS
                       else "not a setting fserver_lib takes")
                raise _errors.make(InvalidArgumentError,
                                   f"HETMESH_CONFIG {path}: [{section}] {key}: {why}; it takes "
                                   f"{', '.join(sorted(set(keyword_of.values()) - _OWN_KEYS))}")
            settings[name] = value
    return settings


def _device(env: _Environment) -> str:
    """This instance's device: STEPMESH_GPU's GPU where torch has CUDA, else the host's."""
    chosen = os.environ.get("HETMESH_STEPMESH_DEVICE")
    if chosen:
        return chosen.replace("{gpu}", str(env.gpu))
    torch = hetmesh.import_torch()
    return f"cuda:{env.gpu}" if torch.cuda.is_available() else "cpu"


def _current_stream(tensor):
    """torch's current stream where `tensor` is on a GPU (what wrote it runs there); None on the
    host."""
    if tensor.device.type != "cuda":
        return None
    return hetmesh.import_torch().cuda.current_stream(tensor.device)


def _current_raw_stream(device: str):
    """torch's current stream handle of a device index, for the C++ push_pull (which pushes only
    tensors of the engine's device, so on a GPU where torch's are, CUDA's or ROCm's); None where
    the engine runs on the host or torch has no GPU."""
    torch = hetmesh.import_torch()
    if device.startswith("cpu") or not torch.cuda.is_available():
        return None
    return raw_current_stream()


def _in_place(what: str, limit: int) -> InPlace:
    return InPlace(_log, "fserver_lib", what, limit, "HETMESH_STEPMESH_MAX_BUFFERS")


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()  # torch 1.13 has no Tensor.nbytes


def _bytes(tensor):
    """A contiguous tensor's bytes, as a 1-D uint8 view."""
    return tensor.reshape(-1).view(hetmesh.import_torch().uint8)


# ---- the layouts of pushes, said once each on the side band ----

_LAYOUT = b"hetmesh.stepmesh.layout:"
_MAX_LAYOUTS = 4096  # an A's layouts known at once (more: it says them again)
_MAX_VIEWS = 64  # places one layout of one A has views kept for


def _layout_of(tensors, keys) -> tuple:
    """Per tensor: its key, dtype, shape past the first dimension, dimensions, and the first
    dimension itself only where the bytes cannot tell it (a later dimension is 0; else -1)."""
    return tuple((int(k), t.dtype, tuple(t.shape[1:]), t.dim(),
                  t.shape[0] if t.dim() > 1 and 0 in t.shape[1:] else -1)
                 for t, k in zip(tensors, keys))


def _handler(value) -> int:
    """A handler as the int it is, or 0 (no handler is 0) where it cannot be one."""
    try:
        number = operator.index(value)
    except TypeError:
        return 0
    return number if 0 < number < 1 << 63 else 0


def _flat(tensor):
    """A 0-d tensor as one of 1 element (the engine's tensors have rows); any other as it is."""
    return tensor.reshape(1) if tensor.dim() == 0 else tensor


def _encode_layout(number: int, layout: tuple) -> bytes:
    entries = [[key, str(dtype).removeprefix("torch."), list(trailing), dims, first]
               for key, dtype, trailing, dims, first in layout]
    return _LAYOUT + json.dumps([number, entries]).encode()


def _decode_layout(rank: int, text: bytes, tensors: int) -> tuple[int, list]:
    """A layout attention `rank` said (of at most `tensors` tensors), checked as hostile input:
    ProtocolError naming the A and what is wrong, never a KeyError or a torch error later."""
    torch = hetmesh.import_torch()

    def refuse(why: str):
        return _errors.make(hetmesh.ProtocolError,
                            f"get_batch: attention {rank} said a layout that {why}")

    def count(value, low=0):
        return isinstance(value, int) and not isinstance(value, bool) and value >= low
    try:
        number, entries = json.loads(text)
    except (ValueError, TypeError, RecursionError) as error:  # nesting past the parser's depth
        raise refuse(f"is not [number, entries] JSON ({type(error).__name__})") from None
    if not count(number, 1) or not isinstance(entries, list) or len(entries) > tensors:
        raise refuse(f"has no number >= 1 and list of at most {tensors} entries "
                     f"(HETMESH_STEPMESH_TENSORS)")
    layout = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 5):
            raise refuse(f"has an entry {str(entry)[:80]} that is not [key, dtype, trailing, "
                         f"dims, first]")
        key, dtype, trailing, dims, first = entry
        if not (count(key, -(1 << 63)) and isinstance(dtype, str) and isinstance(trailing, list)
                and all(count(d) for d in trailing) and count(dims)
                and dims == len(trailing) + 1 - (dims == 0) and count(first, -1)):
            raise refuse(f"has a malformed entry {str(entry)[:80]}")
        kind = getattr(torch, dtype, None)
        if not isinstance(kind, torch.dtype):
            raise refuse(f"pushes tensors of dtype {dtype[:40]}, which this server's torch "
                         f"{torch.__version__} does not have")
        layout.append((key, kind, tuple(trailing), dims, first))
    return number, layout


# ---- the module's state ----

def _open(engine_class, env: _Environment, config: hetmesh.Config):
    """This instance's engine of the job, taking tensors as their bytes."""
    engine = engine_class(config, rank=env.rank, store=env.store, device=_device(env),
                          job="stepmesh")
    engine._take_tensors_as_bytes()
    return engine


class _Worker:
    """An attention instance: push_pull, wait and their traces."""

    def __init__(self, env: _Environment, config: hetmesh.Config):
        self.env = env
        self.engine = _open(hetmesh.AttentionEngine, env, config)
        g = env.group_size
        self.rail = [s * g + env.instance for s in range(env.servers)]  # F ranks, server order
        self.ffn_count = env.servers * g
        self.micro_batches = env.settings["HETMESH_STEPMESH_MICRO_BATCHES"]
        self.tensors = env.settings["HETMESH_STEPMESH_TENSORS"]
        self.max_bytes = env.settings["HETMESH_STEPMESH_MAX_BYTES"]
        self.extra_names = [f"push{i}" for i in range(1, self.tensors)]  # after "tokens"
        limit = env.settings["HETMESH_STEPMESH_MAX_BUFFERS"]
        self.push_in_place = _in_place("push tensors", limit)
        self.pull_in_place = _in_place("pull tensors", limit)
        self.layouts: dict[tuple, int] = {}
        self.said = 0  # layouts said so far: the last one's number (numbers are never reused)
        # The push_pulls in flight and waited for, by handler, and the steady state's push (C++).
        self.fast = hetmesh._native._StepMeshWorker(self.engine, self.micro_batches,
                                                    hetmesh.TimeoutError)
        # Calls of a layout and memory seen before are checked and pushed in C++; the rest come
        # here (_push_pull), which tells the fast path what it learnt.
        self.engine._stepmesh_fast_path(self.rail, self.extra_names, self.max_bytes,
                                        _current_raw_stream(_device(env)))

    def layout_number(self, layout: tuple) -> int:
        number = self.layouts.get(layout)
        if number is None:
            if len(self.layouts) >= _MAX_LAYOUTS:
                self.layouts.clear()  # said again when seen again, under a new number
                self.engine._stepmesh_forget_layouts()
            self.said += 1
            number = self.said
            self.layouts[layout] = number
            message = _encode_layout(number, layout)
            for f in self.rail:
                self.engine.send_message(f, message)
        return number

    def check_sizes(self, push_sizes: list, pull_sizes: list) -> int:
        """The bytes each server answers; refuses sizes the job cannot hold."""
        answer = pull_sizes[0] if pull_sizes else 0
        for s, size in enumerate(pull_sizes):
            if size != answer:
                raise _errors.make(InvalidArgumentError,
                                   f"push_pull: server {s}'s pull tensor holds {size} bytes and "
                                   f"server 0's {answer}: every server answers as many")
        for what, sizes in (("push", push_sizes), ("pull", pull_sizes)):
            for size in sizes:
                if size > self.max_bytes:
                    raise _errors.make(InvalidArgumentError,
                                       f"push_pull: a {what} tensor of {size} bytes; the job's "
                                       f"hold {self.max_bytes} (HETMESH_STEPMESH_MAX_BYTES, the "
                                       f"same for every process of the job)")
        return answer

    def push_pull(self, push_tensors, push_keys, pull_tensors, pull_keys, need_event) -> int:
        handler = self.fast.push_pull(push_tensors, push_keys, pull_tensors, pull_keys,
                                      bool(need_event))
        if handler is None:
            return self._push_pull(push_tensors, push_keys, pull_tensors, pull_keys, need_event)
        return handler

    def _push_pull(self, push_tensors, push_keys, pull_tensors, pull_keys, need_event) -> int:
        # Each tensor's size is read once.
        push_tensors, pull_tensors = list(push_tensors), list(pull_tensors)
        pushes, pulls = len(push_tensors), len(pull_tensors)
        if pushes != len(push_keys) or pulls != len(pull_keys):
            raise _errors.make(InvalidArgumentError,
                               f"push_pull: {pushes} push tensors for {len(push_keys)} keys, "
                               f"{pulls} pull tensors for {len(pull_keys)} keys")
        if pushes > self.tensors:
            raise _errors.make(InvalidArgumentError,
                               f"push_pull: {pushes} push tensors; the job takes "
                               f"{self.tensors} (HETMESH_STEPMESH_TENSORS)")
        servers = len(self.rail)
        if pulls not in (0, servers):
            raise _errors.make(
                NotSupportedError if pulls % servers == 0 else InvalidArgumentError,
                f"push_pull: {pulls} pull tensors for {servers} server(s): hetmesh "
                f"takes one pull tensor per server, in server order (docs/stepmesh.md)")
        push_sizes = [t.numel() * t.element_size() for t in push_tensors]
        pull_sizes = [t.numel() * t.element_size() for t in pull_tensors]
        answer = self.check_sizes(push_sizes, pull_sizes)
        tag = self.layout_number(_layout_of(push_tensors, push_keys))
        # The n-th push of every worker is micro-batch n mod MICRO_BATCHES: counted once sent.
        mb = self.fast.micro_batch()
        # The caller's tensors in place, or (past the allocations kept) copied into the slots.
        send, tensors, copied = None, {}, False
        rows = dict.fromkeys(self.extra_names, 0)
        for i, (t, size) in enumerate(zip(push_tensors, push_sizes)):
            if i:
                rows[self.extra_names[i - 1]] = size
            if size == 0:
                continue
            if self.push_in_place.use(t):
                if i == 0:
                    send = _flat(t)
                else:
                    tensors[self.extra_names[i - 1]] = _flat(t)
            else:
                slot = self.engine.tokens(mb) if i == 0 else self.engine.tensor(
                    mb, self.extra_names[i - 1])
                hetmesh.import_torch().from_dlpack(slot).view(-1)[:size].copy_(_bytes(t))
                copied = True
        into = [None] * self.ffn_count
        copies = []
        for f, t in zip(self.rail, pull_tensors):
            if self.pull_in_place.use(t):
                into[f] = _flat(t)
            else:
                copies.append((f, t))
        # torch's stream where the tensors are on a GPU: what wrote them runs there, and so do the
        # shim's copies.
        stream = None
        if pushes and (need_event or copied) and push_tensors[0].is_cuda:
            stream = _current_stream(push_tensors[0])
        handle = self.engine.push_pull(mb, push_sizes[0] if pushes else 0, send=send,
                                       tensors=tensors, rows=rows, results_into=into,
                                       result_rows=answer, tag=tag, stream=stream)
        handler = self._track(handle, max(1, pushes + (1 if pulls else 0)), mb, copies,
                              (push_tensors, pull_tensors))
        if not copied and not copies:  # all in place: the next such call can go from C++
            self.engine._stepmesh_learn(push_tensors, list(push_keys), pull_tensors, tag)
        return handler

    def _track(self, handle, count: int, mb: int, copies: list, tensors: tuple) -> int:
        # The caller's tensors are held until wait: the engine reads and writes them meanwhile
        # (StepMesh's requests hold them alike), even where the caller dropped its own.
        return self.fast.track(handle, count, mb, copies, tensors)

    def wait(self, handler: int, timeout_ms: float) -> None:
        got = self.fast.wait(number, timeout_ms) if (number := _handler(handler)) else None
        if got is None:
            raise _errors.make(InvalidArgumentError,
                               f"wait: handler {handler} is not a push_pull in flight")
        mb, copies = got
        for f, t in copies:
            slot = hetmesh.import_torch().from_dlpack(self.engine.result(mb, f))
            _bytes(t).copy_(slot.view(-1)[:_nbytes(t)])

    def all_handlers(self, handler: int) -> list[int]:
        number = _handler(handler)
        return list(range(handler, handler + self.fast.handlers(number))) if number else [handler]

    def trace(self, handler: int) -> list[int]:
        trip = self.fast.round_trip(number) if (number := _handler(handler)) else None
        if trip is None:
            raise _errors.make(InvalidArgumentError,
                               f"fetch_trace: handler {handler} has not been waited for")
        # The server whose answer came last; its stamps on its own clock, A's on A's.
        per = max((trip.ffn[f] for f in self.rail), key=lambda p: p.received_at_a)
        return [trip.push_start, per.posted_at_a, per.f_received, per.f_batch_ready,
                per.f_compute_end, per.f_posted, per.received_at_a, trip.completed]

    def close(self) -> None:
        self.engine.close()  # first: the engine may still use the tensors of trips in flight
        self.fast.close()


class _Server:
    """An FFN instance: get_batch and respond, one entry per worker."""

    def __init__(self, env: _Environment, config: hetmesh.Config):
        self.env = env
        self.engine = _open(hetmesh.FfnEngine, env, config)
        self.out_in_place = _in_place("respond's tensors",
                                      env.settings["HETMESH_STEPMESH_MAX_BUFFERS"])
        # A rank -> its layouts said: number -> [(key, dtype, trailing shape, dims)]
        self.layouts: dict[int, dict[int, list]] = {}
        self.refused: dict[int, str] = {}  # A rank -> why its last malformed layout was dropped
        self.rows: dict[tuple, Any] = {}  # (mb, tensor name) -> the row space as 1-D bytes
        # (A rank, layout number) -> (that layout, {(mb, row offset, sizes): (tensors, keys)}):
        # the views a part's bytes made, made again only for a new layout, place or size (three
        # torch calls a tensor cost more than the rest of a round trip's Python here).
        self.views: dict[tuple, tuple] = {}
        self.timeout_ms = config.timeout_ms
        # Batches whose every part lies where one did before, and answers from memory answered
        # from before, go from C++; it also keeps the handlers handed out, and the tensor each
        # (micro-batch, worker)'s last answer is sent from.
        self.fast = hetmesh._native._StepMeshServer(self.engine,
                                                    _current_raw_stream(_device(env)))

    def take_messages(self) -> None:
        """The layouts said since the last call (only when a part names one not known yet: the
        side band holds them in order with the data, and reading it costs a lock)."""
        while (message := self.engine.receive_message(0)) is not None:
            _, rank, data = message
            if not data.startswith(_LAYOUT):
                _log.warning("fserver_lib: a side-band message from attention %d that is not a "
                             "layout: dropped", rank)
                continue
            try:
                number, layout = _decode_layout(rank, data[len(_LAYOUT):],
                                                self.env.settings["HETMESH_STEPMESH_TENSORS"])
            except hetmesh.ProtocolError as error:  # dropped; a push naming it is refused
                _log.warning("fserver_lib: %s: dropped", error)
                self.refused[rank] = str(error)
                continue
            said = self.layouts.setdefault(rank, {})
            if number in said:  # numbered from 1 again: that worker was replaced
                self.fast.forget(rank)
            if len(said) >= 2 * _MAX_LAYOUTS:  # an A uses only the last _MAX_LAYOUTS it said
                for old in list(said)[:_MAX_LAYOUTS]:
                    del said[old]
            said[number] = layout

    def row_space(self, mb: int, name: str):
        view = self.rows.get((mb, name))
        if view is None:
            view = hetmesh.import_torch().from_dlpack(self.engine.inputs(mb, name)).view(-1)
            self.rows[(mb, name)] = view
        return view

    def part_tensors(self, batch, part) -> tuple[list, list]:
        """The tensors one worker pushed, as its layout says, and their keys."""
        layout = self.layouts.get(part.rank, {}).get(part.tag)
        if layout is None:
            self.take_messages()
            layout = self.layouts.get(part.rank, {}).get(part.tag)
        if layout is None:
            last = self.refused.get(part.rank)
            raise _errors.make(hetmesh.ProtocolError,
                               f"get_batch: attention {part.rank} pushed layout {part.tag}, "
                               f"which it never said"
                               + (f" (the last it said and was refused: {last})" if last else ""))
        sizes = tuple(part.rows("tokens" if i == 0 else f"push{i}") for i in range(len(layout)))
        made = self.views.get((part.rank, part.tag))
        if made is None or made[0] is not layout:
            if len(self.views) >= _MAX_LAYOUTS:
                self.views.clear()
            made = self.views[(part.rank, part.tag)] = (layout, {})
        place = (batch.micro_batch, part.row_offset, sizes)
        views = made[1].get(place)
        if views is None:
            views = self.make_views(batch.micro_batch, part, layout, sizes)
            if len(made[1]) >= _MAX_VIEWS:
                made[1].clear()
            made[1][place] = views
        return list(views[0]), list(views[1])

    def make_views(self, mb: int, part, layout: list, sizes: tuple) -> tuple[list, list]:
        tensors = []
        for i, (key, dtype, trailing, dims, first) in enumerate(layout):
            name = "tokens" if i == 0 else f"push{i}"
            size = sizes[i]
            data = self.row_space(mb, name)[part.row_offset:part.row_offset + size]
            try:
                data = data.view(dtype)
                tensors.append(data.view(()) if dims == 0 else data.view(first, *trailing))
            except RuntimeError as error:  # its bytes do not make what its layout says
                raise _errors.make(hetmesh.ProtocolError,
                                   f"get_batch: attention {part.rank} pushed {size} bytes as "
                                   f"tensor {i} of layout {part.tag}, which they do not make "
                                   f"({error})") from None
        return tensors, [entry[0] for entry in layout]

    def get_batch(self) -> list:
        while True:
            try:
                batch = self.fast.get_batch(self.timeout_ms)
                break
            except hetmesh.TimeoutError:
                # A server waits for its workers as long as they live (a lost one is served
                # without; every one lost ends the wait with the engine's error).
                if all(p["state"] == "lost" for p in self.engine.peers()):
                    raise
        if batch is None:
            return []
        if isinstance(batch, list):  # every part where one lay before: handed out in C++
            return batch
        # Every part's tensors first, then the handlers. A part whose push is not what its worker
        # said costs the others nothing: it is not handed out, so that worker's wait times out
        # naming this server, and the log here says why.
        views = []
        for index, part in sorted(enumerate(batch.parts), key=lambda item: item[1].rank):
            try:
                tensors, keys = self.part_tensors(batch, part)
            except hetmesh.ProtocolError as error:
                _log.error("fserver_lib: %s: its part is not handed out", error)
                continue
            self.fast.learn(part, batch.micro_batch, tensors, keys)
            views.append((index, list(tensors), list(keys)))
        return [(self.fast.hand_out(batch, index), tensors, keys)
                for index, tensors, keys in views]

    def respond(self, tensors, handler: int, need_event: bool) -> None:
        given, handler = handler, _handler(handler)
        need_event = bool(need_event)
        if handler and self.fast.respond(tensors, handler, need_event):
            return
        tensors = list(tensors)
        size = sum(_nbytes(t) for t in tensors)
        entry = self.fast.take(handler) if handler else None
        if entry is None:
            raise _errors.make(InvalidArgumentError,
                               f"respond: handler {given} is not a part get_batch handed out "
                               f"and not yet answered")
        batch, index = entry
        part = batch.parts[index]
        if len(tensors) > 1 or size != part.result_rows:
            self.fast.put_back(handler, batch, index)
            raise _errors.make(
                InvalidArgumentError,
                f"respond: {len(tensors)} tensor(s) of {size} bytes for worker "
                f"{part.rank}'s pull tensor of {part.result_rows} bytes (one tensor, as many "
                f"bytes)")
        output, stream = None, None
        try:
            if tensors and size:
                t = _flat(tensors[0])
                if self.out_in_place.use(t):
                    output = t
                else:
                    torch = hetmesh.import_torch()
                    torch.from_dlpack(part.output).view(-1).copy_(_bytes(t))
                    stream = _current_stream(t)  # the copy runs there
                if need_event:
                    stream = _current_stream(t)
            self.engine.respond(batch, part=index, outputs=[output], stream=stream)
        except BaseException:
            self.fast.put_back(handler, batch, index)  # not answered: to respond to again
            raise
        self.fast.hold(batch.micro_batch, part.rank, output)
        if output is not None:
            self.fast.learn_output(output)

    def close(self) -> None:
        self.engine.close()  # first: the engine may still send from the answers held
        self.fast.close()


_state: dict[str, Any] = {}


def _role(kind: str):
    node = _state.get(kind)
    if node is None:
        raise _errors.make(InvalidArgumentError,
                           f"fserver_lib: this process is no {kind} (DMLC_ROLE="
                           f"{os.environ.get('DMLC_ROLE', 'server')!r}), or init() was not "
                           f"called")
    return node


# ---- barriers, through the job's store ----

def _barrier(groups: tuple[str, ...], timeout_ms: float | None = None) -> None:
    """Waits until every member of `groups` came (at most timeout_ms, default the job's
    join_timeout_ms)."""
    env: _Environment = _state["env"]
    if env.role not in groups:
        _log.info("fserver_lib.barrier: a %s is not among %s: nothing to wait for", env.role,
                  "+".join(groups))
        return
    members = sum({"worker": env.workers * env.group_size,
                   "server": env.servers * env.group_size, "scheduler": 1}[g] for g in groups)
    name = "+".join(groups)
    store = _state["store_client"]
    # A barrier whose wait timed out is waited for again on its own key (this member was counted).
    generation = _state["pending"].pop(name, None)
    if generation is None:
        generation = _state["barriers"].get(name, 0) + 1
        _state["barriers"][name] = generation
        arrived = store.add(f"stepmesh/barrier/{name}/{generation}", 1)
    else:
        arrived = 0
    key = f"stepmesh/barrier/{name}/{generation}"
    if arrived == members:
        store.set(key + "/open", b"1")
    else:
        timeout = _state["join_timeout_ms"] if timeout_ms is None else timeout_ms
        try:
            store.get(key + "/open", timeout)
        except hetmesh.TimeoutError as error:
            _state["pending"][name] = generation
            raise _errors.make(hetmesh.TimeoutError,
                               f"fserver_lib.barrier({name}): {members} member(s) expected, not "
                               f"all came within {timeout:.0f} ms") from error


# ---- the API ----

def init() -> None:
    """Joins the job as DMLC_ROLE says; a worker or server returns once every peer is in."""
    if "env" in _state:
        raise _errors.make(InvalidArgumentError, "fserver_lib.init: called twice")
    env = _Environment()
    _state.update(env=env, barriers={}, pending={})
    secret = os.environ.get("HETMESH_JOB_SECRET_FILE") or None
    if env.role == "scheduler":
        host = env.store.rsplit(":", 1)[0]
        _state["store_server"] = hetmesh.StoreServer(
            f"0.0.0.0:{env.store.rsplit(':', 1)[1]}" if host not in ("127.0.0.1", "localhost")
            else env.store, secret)
    config = env.config()
    _state["join_timeout_ms"] = float(config.join_timeout_ms)
    _state["timeout_ms"] = float(config.timeout_ms)
    _state["store_client"] = hetmesh._native.StoreClient(env.store, secret,
                                                         _state["join_timeout_ms"])
    if env.role == "worker":
        _state["worker"] = _Worker(env, config)
    elif env.role == "server":
        _state["server"] = _Server(env, config)


def stop() -> None:
    """Leaves the job: waits until every worker, server and the scheduler has called stop()."""
    env: _Environment = _state.get("env")
    if env is None:
        return
    if "worker" in _state:
        _state["worker"].engine.finish()  # every F hears "leave"
    # The scheduler waits as long as the job runs (StepMesh's does too); the others, as long as
    # joining may take. Then the engines close, and the store goes once every one has.
    _barrier(("worker", "server", "scheduler"),
             float("inf") if env.role == "scheduler" else None)
    store = _state["store_client"]
    for kind in ("worker", "server"):
        node = _state.pop(kind, None)
        if node is not None:
            node.close()
            store.add("stepmesh/closed", 1)
    for pool in _state.pop("notify_pools", []):  # their waits ended with the engine
        pool.shutdown(wait=False, cancel_futures=True)
    if "store_server" in _state:
        instances = (env.workers + env.servers) * env.group_size
        deadline = time.monotonic() + _state["join_timeout_ms"] / 1000
        while True:
            try:
                closed = int(store.get("stepmesh/closed", _state["join_timeout_ms"]))
            except hetmesh.TimeoutError:
                closed = 0
            if closed >= instances:
                break
            if time.monotonic() > deadline:
                _log.warning("fserver_lib.stop: not every instance closed within %.0f ms; the "
                             "store goes now", _state["join_timeout_ms"])
                break
            time.sleep(0.01)
        _state.pop("store_server").close()
    _state.clear()


def barrier(include_server: bool, include_client: bool, instance_barrier: bool = True) -> None:
    """Waits until every server (include_server) and every worker (include_client) called it."""
    groups = tuple(g for g, on in (("server", include_server), ("worker", include_client)) if on)
    if groups:
        _barrier(groups)


def get_nanosecond() -> int:
    return hetmesh.now_ns()


def push_pull(push_tensors, push_keys, pull_tensors, pull_keys, need_event: bool = True) -> int:
    return _role("worker").push_pull(push_tensors, push_keys, pull_tensors, pull_keys, need_event)


def wait(handler: int, timeout_ms: float = 10000) -> None:
    _role("worker").wait(handler, timeout_ms)


def get_all_handlers(handler: int) -> list[int]:
    return _role("worker").all_handlers(handler)


def fetch_trace(handler: int) -> list[int]:
    return _role("worker").trace(handler)


def get_batch() -> list:
    return _role("server").get_batch()


def respond(tensors, handler: int, need_event: bool = False) -> None:
    _role("server").respond(tensors, handler, need_event)


def respond_vec(ret_buffer, tensors_vec, handler_vec) -> None:
    if len(tensors_vec) != len(handler_vec):
        raise _errors.make(InvalidArgumentError,
                           f"respond_vec: {len(tensors_vec)} tensors for {len(handler_vec)} "
                           f"handlers")
    # Every part ordered after the work that wrote ret_buffer: each is sent by its own worker's
    # sender (StepMesh's one sending thread let the first part's event cover the rest).
    for tensor, handler in zip(tensors_vec, handler_vec):
        respond([ret_buffer[:tensor.size(0)]], handler, True)


def register_recv_buffer(tensor, worker_ranks, push_keys) -> None:
    """Accepted; every push already lands in memory hetmesh registered at init, and get_batch's
    tensors are views of it (the tensor given is not written)."""
    _role("server")
    if not _state.get("said_register"):
        _state["said_register"] = True
        _log.info("fserver_lib.register_recv_buffer: not needed on hetmesh (every push lands in "
                  "memory registered at init); get_batch's tensors are where the data is")


# ---- StepMesh's stream helpers, on the engine's stream flags: no kernel, no SM ----

def _engine():
    """This process's engine, for the stream helpers."""
    node = _state.get("worker") or _state.get("server")
    if node is None:
        raise _errors.make(InvalidArgumentError,
                           "fserver_lib: the stream helpers need a worker or a server after "
                           "init()")
    return node.engine


def _on_gpu(tensor) -> bool:
    return tensor.device.type == "cuda"


class _PinnedView:
    """Pinned host memory as a CUDA array (one address on host and device under unified
    addressing); holds the host tensor."""

    def __init__(self, tensor):
        self.tensor = tensor
        self.__cuda_array_interface__ = {
            "shape": tuple(tensor.shape), "typestr": tensor.numpy().dtype.str,
            "data": (tensor.data_ptr(), False), "version": 3}


def map_pinned_tensor(tensor, device_index: int):
    """The pinned host tensor as a tensor of GPU `device_index`, the same memory: what the device
    writes there the host reads (write_flag), and what the host writes the device sees. On a
    machine without CUDA, the tensor itself."""
    torch = hetmesh.import_torch()
    if not torch.cuda.is_available():
        return tensor
    if not tensor.is_pinned() or not tensor.is_contiguous():
        raise _errors.make(InvalidArgumentError,
                           "map_pinned_tensor: the tensor must be pinned and contiguous "
                           "(torch.zeros(..., pin_memory=True))")
    view = torch.as_tensor(_PinnedView(tensor), device=f"cuda:{device_index}")
    _state.setdefault("pinned", {})[view.data_ptr()] = tensor  # wait_flag's host reads it
    return view


def _int64_scalar(tensor, name: str, call: str) -> None:
    torch = hetmesh.import_torch()
    if tensor.dtype != torch.int64 or tensor.numel() < 1:
        raise _errors.make(InvalidArgumentError,
                           f"{call}: {name} must be an int64 tensor (its first element is used)")


def seq_add_one(seq) -> None:
    """seq[0] += 1, on torch's current stream where seq is on a GPU (capturable)."""
    _int64_scalar(seq, "seq", "seq_add_one")
    seq.view(-1)[:1].add_(1)


def write_flag(flag, seq) -> None:
    """flag[0] = seq[0] once the current stream gets here (capturable): a copy on the engine's
    device, ordered on torch's current stream."""
    _int64_scalar(flag, "flag", "write_flag")
    _int64_scalar(seq, "seq", "write_flag")
    if not _on_gpu(seq):
        flag.view(-1)[:1].copy_(seq.view(-1)[:1])
        return
    if not _on_gpu(flag) or flag.device != seq.device:
        # A copy from the GPU into pageable host memory is neither ordered nor capturable.
        raise _errors.make(InvalidArgumentError,
                           f"write_flag: seq is on {seq.device}, so the flag must be too: memory "
                           f"of that GPU, or map_pinned_tensor's view of pinned host memory (it "
                           f"is on {flag.device})")
    _engine()._enqueue_copy(flag.data_ptr(), seq.data_ptr(), 8, _current_stream(seq))


def wait_flag(flag, seq) -> None:
    """Later work on torch's current stream waits until flag[0] >= seq[0], seq read when the stream
    gets there (capturable, replayable). The stream waits on a word the engine's thread raises
    once the flag is high enough, where StepMesh spins a kernel: so `flag` must be memory the host
    reads, map_pinned_tensor's view. On the host (seq not on a GPU), it waits here, at most the
    job's timeout."""
    _int64_scalar(flag, "flag", "wait_flag")
    _int64_scalar(seq, "seq", "wait_flag")
    torch = hetmesh.import_torch()
    if not _on_gpu(seq):
        timeout_ms = _state.get("timeout_ms", 600000.0)
        deadline = time.monotonic() + timeout_ms / 1000
        while int(flag.view(-1)[0]) < int(seq.view(-1)[0]):
            if time.monotonic() > deadline:
                raise _errors.make(hetmesh.TimeoutError,
                                   f"wait_flag: the flag stayed below {int(seq.view(-1)[0])} for "
                                   f"{timeout_ms:.0f} ms")
            time.sleep(20e-6)
        return
    if flag.data_ptr() not in _state.get("pinned", {}):
        raise _errors.make(NotSupportedError,
                           "wait_flag: the flag must be map_pinned_tensor's view of pinned host "
                           "memory (hetmesh's host reads it; no kernel spins on the device)")
    _engine()._enqueue_flag_wait(flag.data_ptr(), seq.data_ptr(), _current_stream(seq),
                                 not torch.cuda.is_current_stream_capturing())


class SimpleNotify:
    """StepMesh's SimpleNotify: holds torch's current stream until a round trip has settled (a
    worker's stream_wait_event) or a batch is in (a server's block_now_stream_and_get_batch), with
    no kernel: the stream waits on a notice the engine raises from this object's thread once the
    host-side call returned, or failed (then the call that collects it raises). Its values change
    per call, so, as StepMesh's, it is not for graphs. On the host (an engine without a GPU) the
    host is the stream: the calls wait where the stream would."""

    def init(self) -> None:
        engine = _engine()
        self._gpu = engine.device.startswith("cuda")
        self._notice = engine._notice() if self._gpu else None
        self._count = 1  # the next notice value to wait for
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "fserver_lib-notify") if self._gpu \
            else None
        if self._pool is not None:  # stop() lets its thread go: the interpreter's exit never waits
            _state.setdefault("notify_pools", []).append(self._pool)
        self._pending: list = []
        self._batch = None

    def _hold(self) -> None:
        """torch's current stream waits for the next notice."""
        if self._gpu:
            torch = hetmesh.import_torch()
            _engine()._enqueue_notice_wait(self._notice, self._count & 0xFFFFFFFF,
                                           torch.cuda.current_stream())

    def _then_notify(self, work):
        """Runs `work` on this object's thread, then raises the notice (also when it failed)."""
        value, engine = self._count & 0xFFFFFFFF, _engine()
        self._count += 1

        def run():
            try:
                return work()
            finally:
                if self._gpu:
                    try:
                        engine._raise_notice(self._notice, value)
                    except hetmesh.Error:
                        pass  # the engine ended, which let every stream go
        if self._gpu:
            future = self._pool.submit(run)
        else:  # the host is the stream: what comes after waits here
            future = concurrent.futures.Future()
            try:
                future.set_result(run())
            except Exception as error:  # raised where StepMesh's user collects it
                future.set_exception(error)
        self._pending.append(future)
        return future

    def stream_wait_event(self, handler: int) -> None:
        self._hold()
        self._then_notify(lambda: wait(handler))

    def wait_event_done(self) -> None:
        """Waits for every stream_wait_event's round trip; raises the first one's error."""
        pending, self._pending = self._pending, []
        errors = [f.exception() for f in pending]
        for error in errors:
            if error is not None:
                raise error

    def block_now_stream(self) -> None:
        self._hold()

    def block_now_stream_and_get_batch(self) -> None:
        self._hold()
        self._batch = self._then_notify(get_batch)

    def get_future_batch_data(self) -> list:
        if self._batch is None:
            raise _errors.make(InvalidArgumentError,
                               "get_future_batch_data: no block_now_stream_and_get_batch before")
        batch, self._batch = self._batch, None
        self._pending.remove(batch)
        return batch.result()


__all__ = ["init", "stop", "barrier", "get_nanosecond", "push_pull", "wait", "get_all_handlers",
           "fetch_trace", "get_batch", "respond", "respond_vec", "register_recv_buffer",
           "SimpleNotify", "map_pinned_tensor", "write_flag", "wait_flag", "seq_add_one"]
