"""hetmesh's connector in vLLM's AFD plugin (vllm-project/afd-plugin): import this module in every
vLLM process of the job (before the plugin builds its connector) and select it with
`additional_config = {"afd": {"connector": "HetmeshAFDConnector", ...}}`. Importing it registers
the connector with the plugin's factory and adds its name to the plugin's list of connectors
(SUPPORTED_AFD_CONNECTORS in afd_plugin/config.py, which its config check reads). docs/embedding.md
says more.

Unlike hetmesh.vllm_afd, which holds the connector itself, this module imports the plugin (and so
vLLM): it is the plugin's loader that imports it.
"""

from __future__ import annotations

import dataclasses
import threading
import types
from typing import Any

import afd_plugin.config
from afd_plugin.connectors import metadata as _plugin
from afd_plugin.connectors.base import AFDConnectorBase, AFDControlPlane, ConnectorExtraInfo
from afd_plugin.connectors.factory import AFDConnectorFactory

from . import ClosedError, NotSupportedError, _errors, vllm_afd

NAME = "HetmeshAFDConnector"

# The plugin's own payload classes, for the payloads this connector makes.
_PLUGIN_TYPES = types.SimpleNamespace(
    dp_metadata=_plugin.AFDDPMetadata, control_payload=_plugin.AFDControlPayload,
    transfer_metadata=_plugin.AFDTransferMetadata, transfer_context=_plugin.AFDTransferContext,
    a2f_payload=_plugin.AFDA2FTransferPayload)


@dataclasses.dataclass(frozen=True)
class HetmeshExtraInfo(ConnectorExtraInfo):
    options: tuple = ()  # (key, value) pairs, every option of vllm_afd.OPTIONS

    @classmethod
    def from_mapping(cls, raw):
        return cls(tuple(sorted(vllm_afd.parse_options(raw).items())))

    def to_mapping(self) -> dict[str, Any]:
        return dict(self.options)


class HetmeshAFDControlPlane(AFDControlPlane):
    def __init__(self, plane: vllm_afd.ControlPlane, closed: threading.Event):
        self._plane = plane
        self._closed = closed

    def update_state_from_dp_metadata(self, payload) -> None:
        self._plane.update_state_from_dp_metadata(payload)

    def send_dp_metadata_list(self, payload) -> None:
        self._plane.send_dp_metadata_list(payload)

    def recv_dp_metadata_list(self):
        try:
            return self._plane.recv_dp_metadata_list()
        except ClosedError:
            # The As have all left, or shutdown closed the connector under the wait. The plugin's
            # FFN loop (v1/worker/ffn_worker.py) counts any Exception as its failure, and its
            # shutdown sets its stop flag only before closing the connector: once closed, end
            # that loop's thread quietly (threading ignores SystemExit), as a stop would.
            self._closed.wait()
            raise SystemExit(0) from None


def _compiled_and_graphs(vllm_config) -> tuple:
    """vLLM's torch.compile mode (falsy: none) and whether it captures CUDA graphs."""
    config = getattr(vllm_config, "compilation_config", None)
    mode = getattr(config, "mode", None)
    if mode is None:
        mode = getattr(config, "level", None)  # vLLM before CompilationMode
    graphs = getattr(config, "cudagraph_mode", None)
    graphs_name = getattr(graphs, "name", str(graphs))
    return (mode if mode is not None and int(mode) else None), graphs_name not in ("NONE", "None")


class HetmeshAFDConnector(AFDConnectorBase):
    """The plugin's connector contract on one hetmesh job (hetmesh.vllm_afd.AfdConnector)."""

    @classmethod
    def parse_extra_config(cls, raw):
        return HetmeshExtraInfo.from_mapping(raw)

    def __init__(self, rank, local_rank, vllm_config, afd_config, role_rank):
        super().__init__(rank, local_rank, vllm_config, afd_config, role_rank)
        model = vllm_config.model_config
        options = self.extra_info.to_mapping()
        if not model.enforce_eager:
            compiled, graphs = _compiled_and_graphs(vllm_config)
            if compiled:
                # Dynamo would trace the connector's calls (host calls, not custom ops) into the
                # compiled forward, running them once at trace time.
                raise _errors.make(
                    NotSupportedError,
                    f"{NAME}: the model's forward is compiled (compilation_config mode "
                    f"{compiled}), and torch.compile cannot hold the connector's calls yet; set "
                    f"compilation_config's mode to NONE (CUDA graphs stay: the connector's "
                    f"device_trigger) or enforce_eager")
            if graphs:
                # The plugin's FULL_DECODE_ONLY runners capture the connector's calls: each then
                # only enqueues work on the stream (hetmesh.vllm_afd_device).
                options["device_trigger"] = True
        if afd_config.compute_gate_on_attention and not options["router_logits_width"]:
            # The gate runs on the attention side: its logits travel, one per routed expert.
            experts = getattr(model.hf_config, "n_routed_experts", None)
            if not experts:
                raise _errors.make(NotSupportedError, vllm_afd._NO_ROUTER_LOGITS)
            options["router_logits_width"] = int(experts)
        self.connector = vllm_afd.AfdConnector(
            role=afd_config.role, role_rank=role_rank,
            attention=afd_config.num_attention_ranks, ffn=afd_config.num_ffn_ranks,
            hidden=model.get_hidden_size(), dtype=model.dtype,
            max_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
            local_rank=local_rank, default_store=f"{afd_config.host}:{afd_config.port}",
            options=options, types=_PLUGIN_TYPES)
        self.attn_size, self.ffn_size = self.connector.attn_size, self.connector.ffn_size
        self._closed = threading.Event()
        self.control_plane = HetmeshAFDControlPlane(self.connector.control_plane, self._closed)

    def init_afd_connector(self) -> None:
        self.connector.init_afd_connector()

    @property
    def is_initialized(self) -> bool:
        return self.connector.is_initialized

    def close(self) -> None:
        self.connector.close()
        self._closed.set()

    def send_attn_output(self, hidden_states, context, **kwargs) -> None:
        self.connector.send_attn_output(hidden_states, context, **kwargs)

    def recv_ffn_output(self, ref_tensor, ubatch_idx: int = 0, **kwargs):
        return self.connector.recv_ffn_output(ref_tensor, ubatch_idx, **kwargs)

    def recv_attn_output(self, ubatch_idx: int = 0, **kwargs):
        return self.connector.recv_attn_output(ubatch_idx, **kwargs)

    def send_ffn_output(self, ffn_output, context, **kwargs) -> None:
        self.connector.send_ffn_output(ffn_output, context, **kwargs)


# Importing this module again (a reload) registers it again, in place of the first.
AFDConnectorFactory.register_connector(NAME, __name__, NAME, replace=True)
if NAME not in afd_plugin.config.SUPPORTED_AFD_CONNECTORS:
    afd_plugin.config.SUPPORTED_AFD_CONNECTORS += (NAME,)
