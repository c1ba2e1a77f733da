"""hetmesh: attention-FFN disaggregation over any accelerator, from Python.

    import hetmesh, torch
    store = hetmesh.StoreServer()                       # or the address of the job's store
    a = hetmesh.AttentionEngine(rank=0, store=store.address, attention=1, ffn=1)
    torch.from_dlpack(a.tokens(0))[:] = ...             # the engine's own memory, no copy
    a.wait(a.push_pull(0))
    partial = torch.from_dlpack(a.result(0, 0))

Every slot (A's tokens, experts, weights and results; F's parts and outputs) is a hetmesh.Slot with
__dlpack__ and __dlpack_device__. Calls that wait release the GIL. Errors are hetmesh.Error
subclasses (hetmesh/_errors.py). See docs/python.md.

Run programs with the interpreter the package was built for (hetmesh.BUILT_FOR, e.g. through the
hetmesh-python launcher beside the package): its native module is for that Python only.
"""

from __future__ import annotations

import atexit
import difflib
import os
import weakref
from typing import NamedTuple

from ._interpreter import BUILT_FOR, import_torch, native_module
from . import _errors
from ._errors import (
    ClosedError,
    DeviceError,
    Error,
    InvalidArgumentError,
    JobFailedError,
    NotAuthorizedError,
    NotSupportedError,
    OutOfMemoryError,
    PeerLostError,
    ProtocolError,
    TimeoutError,
)

_native = native_module()
__version__ = _native.__version__

Batch = _native.Batch
Config = _native.Config
Part = _native.Part
RoundTrip = _native.RoundTrip
Slot = _native.Slot
Stream = _native.Stream
StoreServer = _native.StoreServer
devices = _native.devices
now_ns = _native.now_ns
refused_plugins = _native.refused_plugins
write_secret = _native.write_secret

__all__ = [
    "AttentionEngine", "Batch", "ClosedError", "Config", "DeviceError", "Error", "FfnEngine",
    "InvalidArgumentError", "JobFailedError", "NotAuthorizedError", "NotSupportedError",
    "OutOfMemoryError", "Part", "PeerLostError", "ProtocolError", "RoundTrip", "Slot",
    "StoreServer", "Stream", "TimeoutError", "as_tensor", "config", "devices", "import_torch",
    "Launched", "launched", "now_ns", "refused_plugins", "write_secret", "BUILT_FOR",
]

# Keyword arguments of the engines and config(), and the [section] key each one sets.
_KEYS = {
    "attention": ("job", "attention"),
    "ffn": ("job", "ffn"),
    "micro_batches": ("job", "micro_batches"),
    "queue_depth": ("job", "queue_depth"),
    "layers": ("job", "layers"),
    "gather": ("job", "gather"),
    "topology": ("job", "topology"),
    "ffns_of": ("job", "ffns_of"),
    "timeout_ms": ("job", "timeout_ms"),
    "join_timeout_ms": ("job", "join_timeout_ms"),
    "io_timeout_ms": ("job", "io_timeout_ms"),
    "heartbeat_ms": ("job", "heartbeat_ms"),
    "gather_window_ms": ("job", "gather_window_ms"),
    "tokens": ("model", "tokens"),
    "hidden": ("model", "hidden"),
    "experts": ("model", "experts"),
    "top_k": ("model", "top_k"),
    "a2f_dtype": ("model", "a2f_dtype"),
    "f2a_dtype": ("model", "f2a_dtype"),
    "a2f_tensors": ("model.a2f_tensors", None),
    "attention_devices": ("devices", "attention"),
    "ffn_devices": ("devices", "ffn"),
    "transport": ("transport", "kind"),
    "listen_host": ("transport", "listen_host"),
    "metrics_listen": ("metrics", "listen"),
}


def _toml_value(name: str, value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str, list, tuple)):
        raise TypeError(f"hetmesh: {name}={value!r}: expected an int or a str")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(name, v) for v in value) + "]"
    if isinstance(value, int):
        return str(value)
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _tensor_lines(tensors) -> list[str]:
    """a2f_tensors={"router_logits": ("float32", 256)} (or {"dtype": ..., "columns": ...}) as the
    lines of [model.a2f_tensors]."""
    if not isinstance(tensors, dict):
        raise TypeError(f"hetmesh: a2f_tensors={tensors!r}: expected a dict of name -> "
                        f"(dtype, columns)")
    lines = []
    for name, spec in tensors.items():
        if isinstance(spec, dict):
            dtype, columns = spec.get("dtype"), spec.get("columns")
        elif isinstance(spec, (tuple, list)) and len(spec) == 2:
            dtype, columns = spec
        else:
            raise TypeError(f"hetmesh: a2f_tensors[{name!r}]={spec!r}: expected (dtype, columns)")
        dtype = _DTYPE_NAMES.get(str(dtype).removeprefix("torch."), str(dtype))
        lines.append(f"{_toml_value('a2f_tensors', str(name))} = {{ dtype = "
                     f"{_toml_value('a2f_tensors', dtype)}, columns = "
                     f"{_toml_value('a2f_tensors', columns)} }}")
    return lines


# torch's names for the wire's dtypes.
_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
                "float8_e4m3fn": "fp8"}

# Keyword-built configs default the A2F dtype to bf16, not the file's fp8: fp8 needs a torch with
# float8_e4m3fn to be computed on (as_tensor), and a file states its dtypes for every process.
_KEYWORD_DEFAULTS = {"a2f_dtype": "bf16"}

# Per-instance arguments of the engines, which a config does not hold.
_ENGINE_ARGUMENTS = ("rank", "store", "secret_file", "device", "job")


def config(path: str | os.PathLike | None = None, **job) -> Config:
    """A job config: the TOML file at `path`, or one made of keyword arguments (attention, ffn,
    micro_batches, tokens, hidden, top_k, a2f_dtype, f2a_dtype, attention_devices, ffn_devices,
    transport, timeout_ms, metrics_listen, ...), validated as a whole by the same reader as `hetmesh demo`'s.
    Not both: a file is what every process of a job shares. From keywords, a2f_dtype defaults to
    "bf16" (a file's default is "fp8")."""
    if path is not None:
        if job:
            raise TypeError(
                f"hetmesh: give a config file or keyword arguments, not both (got {path!s} and "
                f"{', '.join(sorted(job))})")
        return Config.load(os.fspath(path))
    sections: dict[str, list[str]] = {}
    for name, value in {**_KEYWORD_DEFAULTS, **job}.items():
        if name in _ENGINE_ARGUMENTS:
            raise TypeError(f"hetmesh: {name}= is an argument of the engines "
                            f"(AttentionEngine(..., {name}=...)), not of the job's config")
        if name not in _KEYS:
            near = difflib.get_close_matches(name, _KEYS, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise TypeError(f"hetmesh: unknown job setting '{name}'{hint}; known: "
                            f"{', '.join(sorted(_KEYS))}")
        section, key = _KEYS[name]
        if key is None:
            sections.setdefault(section, []).extend(_tensor_lines(value))
            continue
        sections.setdefault(section, []).append(f"{key} = {_toml_value(name, value)}")
    text = "".join(f"[{s}]\n" + "\n".join(lines) + "\n\n" for s, lines in sections.items())
    return Config.parse(text, "<keyword arguments>")


class Launched(NamedTuple):
    """This process's place in a job, from the launcher that started it (hetmesh.launched)."""
    launcher: str  # "torchrun", "openmpi", "slurm", "leaderworkerset", "kubernetes"
    process: int  # its rank among the job's processes
    role: str  # "attention" or "ffn"
    rank: int  # its rank in that role
    local_rank: int  # its rank on this host
    store: str  # where rank 0 hosts the job's store ("" where the launcher says nothing)

    @property
    def hosts_store(self) -> bool:
        """Whether this process hosts the job's store (process 0)."""
        return self.process == 0


def launched(config_or_path=None, **job) -> "Launched | None":
    """Where the launcher that started this process (torchrun, mpirun, srun, a Kubernetes indexed
    Job or LeaderWorkerSet) puts it in the job (the config, a file or keywords, as the engines
    take it): ranks 0..A-1 the attention instances, then the FFN instances; the store at
    MASTER_ADDR:MASTER_PORT (under torchrun, the port after it), which process 0 hosts
    (hetmesh.StoreServer(launched.store, ...)). None where no launcher's variables are set; a
    count other than the job's is an InvalidArgumentError naming both (docs/launching.md)."""
    place = _native.launched(_engine_config(config_or_path, job))
    return None if place is None else Launched(**place)


def _engine_config(config_or_path, job) -> Config:
    if isinstance(config_or_path, Config):
        if job:
            raise TypeError("hetmesh: give a Config or keyword arguments, not both")
        return config_or_path
    return config(config_or_path, **job)


# Engines still alive when the interpreter exits are shut down first, while everything they use
# exists: their peers hear that they quit, and no engine thread outlives the interpreter.
_live_engines: "weakref.WeakSet" = weakref.WeakSet()


@atexit.register
def _shut_down_live_engines() -> None:
    for engine in list(_live_engines):
        engine._shutdown()


class _Engine:
    """What both engines take and do in Python: the job as a Config, a file or keywords; close()
    and a `with` block; shut down at the interpreter's exit if still alive."""

    def __init__(self, config=None, *, rank: int = 0, store: str = "", secret_file: str = "",
                 device: str = "", job: str = "", **settings):
        if not isinstance(job, str) or "/" in job:
            raise TypeError(f"hetmesh: job={job!r}: expected a name without '/'")
        super().__init__(_engine_config(config, settings), rank, store, os.fspath(secret_file),
                         device, job)
        _live_engines.add(self)

    def close(self) -> None:
        """Ends the engine: finish() (an engine that had failed ends as failed, without raising:
        the call that saw its failure raised it), then its slots and calls are refused. Its memory
        goes now, or with the last tensor taken from its slots, which stay valid. Idempotent."""
        self._close(True)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        self.close()


class AttentionEngine(_Engine, _native.AttentionEngine):
    """An attention instance (A): pushes each micro-batch's tokens and routing to every FFN
    instance and waits for their partial results, which land in result(mb, f).

    config: a Config, a TOML file's path, or None with the job as keyword arguments.
    store: "host:port" of the job's store (hetmesh.StoreServer().address), or an etcd URL; default
    the config's [rendezvous] address. secret_file: the job's secret (default: the config's, or
    HETMESH_JOB_SECRET_FILE). device: this instance's device selector ("cuda:0"), overriding the
    config's. Blocks (without the GIL) until every FFN instance is in the job.
    """

    def __exit__(self, kind, value, traceback):
        if kind is None:
            try:
                self.finish()  # the Fs hear "leave"; an engine that failed raises its error
            finally:
                self._close(False)
        else:
            self._close(False)  # the Fs hear "quit", once no tensor of its slots holds it


class FfnEngine(_Engine, _native.FfnEngine):
    """An FFN instance (F): get_batch() gives each micro-batch's parts (one per attention
    instance), respond(batch) sends each part's output back into its A's result slot.

    Arguments as AttentionEngine's. Blocks (without the GIL) until every A is in the job.
    """

    def batches(self, timeout_ms: float | None = None):
        """Every micro-batch until every attention instance has left: `for b in f.batches():`."""
        while (batch := self.get_batch(timeout_ms)) is not None:
            yield batch


def as_tensor(slot: Slot, *, raw: bool = False):
    """The torch tensor over `slot`'s memory (no copy); an fp8 slot as torch.float8_e4m3fn.
    A torch without float8_e4m3fn cannot compute on fp8: that is an error (a uint8 view would
    take 1.7 as 1, silently), unless raw=True asks for the bytes as uint8."""
    torch = import_torch()
    if slot.dtype == "fp8" and not raw:
        if not hasattr(torch, "float8_e4m3fn"):
            raise _errors.make(
                NotSupportedError,
                f"hetmesh.as_tensor: this slot holds fp8, and torch {torch.__version__} has no "
                f"float8_e4m3fn: use a2f_dtype=\"bf16\" (the default from keywords) or a torch "
                f"with float8_e4m3fn (2.1 or later); as_tensor(slot, raw=True) gives its bytes")
        return torch.from_dlpack(slot).view(torch.float8_e4m3fn)
    return torch.from_dlpack(slot)
