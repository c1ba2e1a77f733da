"""hetmesh's errors: one class per status, each a hetmesh.Error carrying the status and the peer.

The C++ engines raise hetmesh::Error with a status and a message that names what failed and where;
the native module turns each into the class below for its status (from_native), so that
`except hetmesh.PeerLostError` and `except TimeoutError` both work.
"""

from __future__ import annotations

import builtins
import re


class Error(Exception):
    """A hetmesh failure.

    status: the hm_status code (int); status_name: "HM_ERR_TIMEOUT", ...; peer: the instance the
    error names, as "ffn:1" or "attention:0", or None.
    """

    def __init__(self, message: str, status: int = 0, status_name: str = "", peer: str | None = None):
        super().__init__(message)
        self.status = status
        self.status_name = status_name
        self.peer = peer


class InvalidArgumentError(Error, ValueError):
    """A bad argument or config value (HM_ERR_INVALID_ARGUMENT)."""


class NotSupportedError(Error, NotImplementedError):
    """The device or plugin lacks what was asked (HM_ERR_NOT_SUPPORTED)."""


class OutOfMemoryError(Error, MemoryError):
    """Device or host memory exhausted (HM_ERR_OUT_OF_MEMORY)."""


class DeviceError(Error):
    """The device, its driver or its plugin failed (device lost, backend error, plugin bug)."""


class TimeoutError(Error, builtins.TimeoutError):
    """A wait ran out of time; `peer` names the instance that did not answer, where one did not."""


class PeerLostError(Error, ConnectionError):
    """A peer died, hung or was replaced; `peer` names it."""


class ProtocolError(Error):
    """A peer sent something malformed."""


class JobFailedError(Error):
    """Another instance of the job failed first (its report is the job's root cause)."""


class NotAuthorizedError(Error, PermissionError):
    """A peer or the store refused: this side lacks the job's secret."""


class ClosedError(Error):
    """The engine was finished or closed: by an earlier call, or by another thread during this one."""


_BY_STATUS = {
    1: InvalidArgumentError,
    2: NotSupportedError,
    3: OutOfMemoryError,
    4: DeviceError,
    6: TimeoutError,
    7: InvalidArgumentError,
    8: DeviceError,
    9: DeviceError,
    10: DeviceError,
    1000: PeerLostError,
    1001: ProtocolError,
    1002: JobFailedError,
    1003: NotAuthorizedError,
    1004: ClosedError,
}

# "ffn 1 lost: ...", "attention 0 hung: ...", "no answer from ffn 1 within ...", "no answer from
# ffn 0, ffn 1 within ...": the instance an engine's message is about (the first one it names).
_PEER = re.compile(r"(?:no answer from )?\b(attention|ffn) (\d+)(?= lost| hung| within|, )")


def peer_in(message: str) -> str | None:
    """The peer an engine's message names, as "role:rank", or None."""
    match = _PEER.search(message)
    return f"{match.group(1)}:{match.group(2)}" if match else None


def from_native(status: int, status_name: str, message: str) -> Error:
    cls = _BY_STATUS.get(status, Error)
    peer = peer_in(message) if cls in (TimeoutError, PeerLostError) else None
    return cls(message, status, status_name, peer)


_NAMES = {1: "HM_ERR_INVALID_ARGUMENT", 2: "HM_ERR_NOT_SUPPORTED", 6: "HM_ERR_TIMEOUT", 1000: "PEER_LOST",
          1001: "PROTOCOL_ERROR", 1004: "CLOSED"}


def make(cls, message: str, peer: str | None = None) -> Error:
    """An error of class `cls` raised from Python, with the status the native module gives it."""
    status = next(s for s, c in _BY_STATUS.items() if c is cls)
    return cls(message, status, _NAMES[status], peer)
