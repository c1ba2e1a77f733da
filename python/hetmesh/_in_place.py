"""Which of the application's allocations one direction of an exchange uses in place: the one
policy of hetmesh.stepmesh (fserver_lib) and hetmesh.vllm_afd."""

from __future__ import annotations

import logging
from typing import Callable, Optional


class InPlace:
    """An allocation is used in place from its first sight (registered once, for good), unless
    that is the dearer way: more than `limit` allocations came (tensors at a new address every
    step would pin memory without bound), or, where `staged_bytes` (the engine's counter) is
    given, its first exchange's bytes went through host staging (the transport could not reach
    that memory, and one copy into the engine's own memory costs less). Then the caller copies
    through the engine's slots; `log` says so once per reason, as "{owner}: {what} {why}"."""

    def __init__(self, log: logging.Logger, owner: str, what: str, limit: int, knob: str,
                 staged_bytes: Optional[Callable[[], int]] = None):
        self.log, self.owner, self.what, self.limit, self.knob = log, owner, what, limit, knob
        self.staged_bytes = staged_bytes
        self.in_place: dict[int, bool] = {}  # allocation base -> used in place
        self.probes: dict = {}  # key -> (base, staged bytes before its first exchange)
        self.said: set[str] = set()

    def use(self, tensor, key=None) -> bool:
        """Whether this exchange goes from/into `tensor` in place; `key` names the exchange for
        settle()."""
        base = tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()
        known = self.in_place.get(base)
        if known is not None:
            return known
        if len(self.in_place) >= self.limit:
            self._say("more", f"came from more than {self.limit} allocations (a new one every "
                      f"step?), and registering each would pin memory without bound "
                      f"({self.knob})")
            return False
        self.in_place[base] = True
        if self.staged_bytes is not None and key is not None:
            self.probes[key] = (base, self.staged_bytes())
        return True

    def settle(self, key) -> bool:
        """Once the exchange `key` has moved its bytes: did its first sight go through host
        staging? True where it did (its allocation is no longer used in place)."""
        probe = self.probes.pop(key, None)
        if probe is None or self.staged_bytes() <= probe[1]:
            return False
        self.in_place[probe[0]] = False
        self._say("staged", "is memory the transport reaches only through host staging")
        return True

    def _say(self, reason: str, why: str) -> None:
        if reason not in self.said:
            self.said.add(reason)
            self.log.warning("%s: %s %s; copying such ones through hetmesh's slots",
                             self.owner, self.what, why)
