"""vLLM's AFD plugin's runners, reduced to how they call a connector (afd_plugin/v1/worker/
ffn_model_runner.py, ffn_worker.py and model_executor/models/deepseek_v2.py), driving hetmesh's
connector in processes of their own. vLLM is not installed here: the payloads are
hetmesh.vllm_afd's plain classes, with the plugin's fields.

The A's "attention" and the F's "FFN" are elementwise, so each row's numbers do not depend on how
rows are batched: every A checks its final hidden states against the same layers computed in its
own process alone.
"""

import collections
import os
import signal

import torch

import hetmesh
from hetmesh import vllm_afd

HIDDEN = 32
LAYERS = 3
STAGES = (0, 1)
STEPS = 6
MAX_TOKENS = 16


def token_counts(step: int, stage: int, attention: int) -> list[int]:
    """Each A's tokens in one stage of one step: varying, 1 ... MAX_TOKENS."""
    return [(step * 7 + stage * 5 + a * 3) % MAX_TOKENS + 1 for a in range(attention)]


def attention_input(step: int, stage: int, rank: int, rows: int) -> torch.Tensor:
    values = torch.arange(rows * HIDDEN).view(rows, HIDDEN) % 17 + step + stage + rank
    return values.to(torch.bfloat16)


def ffn_layer(x: torch.Tensor, layer: int, out: torch.Tensor | None = None) -> torch.Tensor:
    y = (x.float() * 0.5 + (layer + 1)).to(torch.bfloat16)
    return y if out is None else out.copy_(y)


def attention_layer(x: torch.Tensor) -> torch.Tensor:
    return x.sub_(1)


def expected(step: int, stage: int, rank: int, rows: int) -> torch.Tensor:
    x = attention_input(step, stage, rank, rows)
    for layer in range(LAYERS):
        x = attention_layer(ffn_layer(x, layer))
    return x


# With router logits: the gate's output on the attention side, here the first LOGITS columns of
# the hidden states, doubled, in float32; layer 0 is dense (none travel).
LOGITS = 4
RoutingSpec = collections.namedtuple("RoutingSpec", "router_logits_width router_logits_dtype")


def gate(x: torch.Tensor) -> torch.Tensor:
    return x[:, :LOGITS].float() * 2


def tensor_device(c) -> str:
    """Where the instance's tensors live: its hetmesh device's, for torch."""
    return "cuda:0" if c.device.startswith("cuda") else "cpu"


def connector(role, rank, attention, ffn, store, options):
    c = vllm_afd.AfdConnector(role=role, role_rank=rank, attention=attention, ffn=ffn,
                              hidden=HIDDEN, dtype=torch.bfloat16, max_tokens=MAX_TOKENS,
                              default_store=store, options=options)
    c.init_afd_connector()
    return c


def rang(c) -> str:
    """With device_trigger, what its device rang: "; device rang R completed C failed F"."""
    if not c.options["device_trigger"]:
        return ""
    trips = c.engine.device_trips()
    return f"; device rang {trips.rung} completed {trips.completed} failed {trips.failed}"


def run_attention(rank, attention, ffn, store, options, fresh_tensors=False,
                  reverse_stages=False, logits=False, check_each_step=True, die_at=None):
    """An A as the plugin's model runner drives it: each step's control payload, then per layer
    every stage's send_attn_output before any recv_ffn_output (two ubatches in flight), in stage
    order or, with reverse_stages, the last stage first. Without check_each_step (device_trigger)
    it neither checks nor verifies a step's output (vLLM's runner does not check: the next step's
    control plane raises what failed). With die_at = (step, layer) it kills itself there, its
    stages sent."""
    c = connector("attention", rank, attention, ffn, store, options)
    device = tensor_device(c)
    static = {stage: torch.zeros(MAX_TOKENS, HIDDEN, dtype=torch.bfloat16, device=device)
              for stage in STAGES}
    kept = []  # with fresh_tensors: every step's tensors stay alive, so each is a new allocation
    try:
        for step in range(STEPS):
            counts = {stage: token_counts(step, stage, attention) for stage in STAGES}
            payload = vllm_afd.ControlPayload(
                {stage: vllm_afd.DPMetadata(torch.tensor(n, dtype=torch.int32))
                 for stage, n in counts.items()})
            c.control_plane.update_state_from_dp_metadata(payload)
            c.control_plane.send_dp_metadata_list(payload)
            xs = {}
            for stage in STAGES:
                rows = counts[stage][rank]
                buffer = torch.zeros(MAX_TOKENS, HIDDEN, dtype=torch.bfloat16, device=device) \
                    if fresh_tensors else static[stage]
                kept.append(buffer)
                xs[stage] = buffer[:rows].copy_(attention_input(step, stage, rank, rows))
            order = STAGES[::-1] if reverse_stages else STAGES
            for layer in range(LAYERS):
                for stage in order:
                    metadata = vllm_afd.TransferMetadata(layer, stage, [xs[stage].shape[0]])
                    gated = {"router_logits": gate(xs[stage])} if logits and layer > 0 else {}
                    c.send_attn_output(xs[stage], vllm_afd.TransferContext(metadata), **gated)
                if die_at == (step, layer):
                    os.kill(os.getpid(), signal.SIGKILL)
                for stage in order:
                    out = c.recv_ffn_output(ref_tensor=xs[stage], ubatch_idx=stage)
                    assert out.data_ptr() == xs[stage].data_ptr(), "not the ref_tensor"
                    attention_layer(out)
            if c.options["device_trigger"]:
                if not check_each_step:
                    continue
                if device == "cuda:0":
                    torch.cuda.current_stream().synchronize()
                c.check_round_trips()  # before the step's output is used
            for stage in STAGES:
                want = expected(step, stage, rank, counts[stage][rank])
                assert torch.equal(xs[stage].cpu(), want), (step, stage, xs[stage], want)
        print(f"attention {rank}: verified {STEPS} steps x {LAYERS} layers x {len(STAGES)} "
              f"stages; counters {c.counters()}{rang(c)}", flush=True)
    except hetmesh.PeerLostError as e:
        print(f"attention {rank}: lost {e.peer}: {e}", flush=True)
    finally:
        c.close()


# The batch sizes the A's graphs are captured for (A 0's rows; stage 1 and each later A add one).
GRAPH_SIZES = (4, 7)


def run_attention_graphs(rank, attention, ffn, store, options):
    """An A as the plugin's FULL_DECODE_ONLY runner drives it (device_trigger, on cuda): the As'
    rows differ by rank (vLLM pads them alike; the F's windows are tested so); the first step of
    each size runs
    eagerly (a warmup), then its forward with every send and receive is captured in a CUDA graph
    (the F captures its loop for the same counts), and each step of that size replays it."""
    c = connector("attention", rank, attention, ffn, store, options)
    static = {stage: torch.zeros(MAX_TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda:0")
              for stage in STAGES}
    graphs = {}
    capture_stream = torch.cuda.Stream()

    def control(counts, **flags):
        payload = vllm_afd.ControlPayload(
            {stage: vllm_afd.DPMetadata(torch.tensor(n, dtype=torch.int32))
             for stage, n in counts.items()}, **flags)
        c.control_plane.update_state_from_dp_metadata(payload)
        c.control_plane.send_dp_metadata_list(payload)

    def forward(counts):
        xs = {stage: static[stage][:counts[stage][rank]] for stage in STAGES}
        for layer in range(LAYERS):
            for stage in STAGES:
                metadata = vllm_afd.TransferMetadata(layer, stage, [xs[stage].shape[0]])
                c.send_attn_output(xs[stage], vllm_afd.TransferContext(metadata))
            for stage in STAGES:
                attention_layer(c.recv_ffn_output(ref_tensor=xs[stage], ubatch_idx=stage))

    def run(step, counts, graph=None):
        for stage in STAGES:
            rows = counts[stage][rank]
            static[stage][:rows].copy_(attention_input(step, stage, rank, rows))
        graph.replay() if graph is not None else forward(counts)
        torch.cuda.current_stream().synchronize()
        c.check_round_trips()
        for stage in STAGES:
            rows = counts[stage][rank]
            want = expected(step, stage, rank, rows)
            assert torch.equal(static[stage][:rows].cpu(), want), (step, stage)

    replays = 0
    try:
        for step in range(STEPS):
            size = GRAPH_SIZES[step % len(GRAPH_SIZES)]
            counts = {stage: [size + stage + a for a in range(attention)] for stage in STAGES}
            if size not in graphs:
                # As vLLM's graph_capture: the warmup and the capture on a stream of their own.
                with torch.cuda.stream(capture_stream):
                    control(counts, is_warmup=True)
                    run(step, counts)
                    control(counts, is_graph_capturing=True)
                    graphs[size] = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graphs[size], stream=capture_stream):
                        forward(counts)
            control(counts)
            run(step, counts, graphs[size])
            replays += 1
        print(f"attention {rank}: verified {STEPS} steps x {LAYERS} layers x {len(STAGES)} "
              f"stages, {replays} replayed from {len(graphs)} graphs{rang(c)}", flush=True)
    except hetmesh.PeerLostError as e:
        print(f"attention {rank}: lost {e.peer}: {e}", flush=True)
    finally:
        c.close()


def run_ffn(rank, attention, ffn, store, options, die_at=None, logits=False, graphs=False):
    """An F as the plugin's FFN worker drives it: each control payload, then per layer and stage
    recv_attn_output, the FFN, send_ffn_output; until its As have left. Counts the stages whose
    hidden states came in place (the engine's own rows, no copy) and, with logits, whose router
    logits were the gate's. With graphs (device_trigger, on cuda), as its FULL_DECODE_ONLY
    runner: a step under capture captures that loop in a CUDA graph for its counts, and each
    later step of the same counts replays it; an F that cannot capture skips such a step (the A's
    capture sends nothing)."""
    c = connector("ffn", rank, attention, ffn, store, options)
    ratio = attention // ffn
    group = range(rank * ratio, (rank + 1) * ratio)
    out = {stage: torch.zeros(MAX_TOKENS * ratio, HIDDEN, dtype=torch.bfloat16,
                              device=tensor_device(c)) for stage in STAGES}
    steps = in_place = received = logits_right = replays = 0
    captured = {}
    try:
        while True:
            try:
                payload = c.control_plane.recv_dp_metadata_list()
            except hetmesh.ClosedError:
                break
            key = tuple((stage, tuple(m.num_tokens_across_dp_cpu.tolist()))
                        for stage, m in sorted(payload.dp_metadata_list.items()))
            if payload.is_graph_capturing:
                if graphs:
                    c.control_plane.update_state_from_dp_metadata(payload)
                    captured[key] = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(captured[key]):
                        for layer in range(LAYERS):
                            for stage in sorted(payload.dp_metadata_list):
                                got = c.recv_attn_output(ubatch_idx=stage)
                                c.send_ffn_output(ffn_layer(got.hidden_states, layer),
                                                  got.context)
                continue
            if key in captured:
                captured[key].replay()
                replays += 1
                steps += 1
                continue
            c.control_plane.update_state_from_dp_metadata(payload)
            for layer in range(LAYERS):
                for stage in sorted(payload.dp_metadata_list):
                    spec = RoutingSpec(LOGITS, torch.float32) if logits and layer > 0 else None
                    got = c.recv_attn_output(ubatch_idx=stage, routing_spec=spec)
                    received += 1
                    rows_of = hetmesh.as_tensor(c.engine.inputs(stage, "tokens"))
                    in_place += got.hidden_states.data_ptr() == rows_of.data_ptr()
                    if spec is not None:
                        logits_right += torch.equal(got.router_logits, gate(got.hidden_states))
                    counts = payload.dp_metadata_list[stage].num_tokens_across_dp_cpu.tolist()
                    assert got.context.metadata.seq_lens == [counts[a] for a in group], (
                        got.context.metadata.seq_lens, counts)
                    rows = sum(counts[a] for a in group)
                    assert tuple(got.hidden_states.shape) == (rows, HIDDEN)
                    if die_at == (steps, layer, stage):
                        os.kill(os.getpid(), signal.SIGKILL)
                    rows = got.hidden_states.shape[0]
                    c.send_ffn_output(ffn_layer(got.hidden_states, layer, out[stage][:rows]),
                                      got.context)
            steps += 1
    except hetmesh.PeerLostError as e:
        print(f"ffn {rank}: lost {e.peer} after {steps} steps: {e}", flush=True)
        c.close()
        return
    if graphs:
        torch.cuda.current_stream().synchronize()
    print(f"ffn {rank}: served {steps} steps; in place {in_place}/{received}; logits right "
          f"{logits_right}; counters {c.counters()}{rang(c)}; replayed {replays}", flush=True)
    c.close()
