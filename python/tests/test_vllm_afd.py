"""hetmesh's connector for vLLM's AFD plugin, driven in the plugin runners' order (vllm_runner.py)
by real processes: 1A1F, 2A1F, 2A2F and 4A2F with token counts that vary per step, stage and A;
an F killed mid-step; tensors at new addresses every step; and what the connector refuses."""

import os
import re
import sys
import threading

import pytest
import torch

import hetmesh
from hetmesh import vllm_afd
from hetmesh.bench import free_port
from vllm_runner import RoutingSpec

TESTS = os.path.dirname(os.path.abspath(__file__))

INSTANCE = """
import sys
sys.path.insert(0, {tests!r})
import vllm_runner
vllm_runner.run_{role}({rank}, {attention}, {ffn}, {store!r}, {options!r}, **{extra!r})
"""


def start_job(spawn, attention, ffn, options=None, extra=None, devices=None,
              attention_runner="attention"):
    """Every instance of one job in a process of its own (an A runs vllm_runner's
    run_{attention_runner}); F 0 hosts the store. Returns {(role, rank): Instance}."""
    options = {"job": "test", "timeout_ms": 60000, **(options or {})}
    store = f"127.0.0.1:{free_port()}"
    instances = {}
    for role, count in (("ffn", ffn), ("attention", attention)):
        for rank in range(count):
            instances[role, rank] = spawn(INSTANCE.format(
                tests=TESTS, role=attention_runner if role == "attention" else role, rank=rank,
                attention=attention, ffn=ffn, store=store,
                options={**options, "device": (devices or {}).get(role, "cpu:0")},
                extra=(extra or {}).get((role, rank), {})))
    return instances


def finish(instances):
    results = {}
    for key, instance in instances.items():
        code, out, err = instance.finish()
        assert code == 0, f"{key}: exit {code}\n{out}\n{err}"
        results[key] = out
    return results


def counters(line: str) -> dict:
    return eval(re.search(r"counters (\{.*\})", line).group(1))  # the engine's own dict


def from_python(rows_of) -> int:
    """The exchanges of vllm_runner's job that go through the connector's Python on one side, of
    `rows_of(step, stage)` rows from one tensor per stage: each stage's first (its memory is
    learnt once its bytes were seen not staged) and those with more rows than any before from it
    (learnt at once); the rest go from C++."""
    from vllm_runner import STAGES, STEPS

    count = 0
    for stage in STAGES:
        most = 0
        for step in range(STEPS):
            count += rows_of(step, stage) > most
            most = max(most, rows_of(step, stage))
    return count


@pytest.mark.parametrize("attention,ffn,transport", [(1, 1, "ipc"), (2, 1, "tcp"), (2, 2, "ipc"),
                                                     (4, 2, "tcp")])
def test_the_runners_get_the_one_process_numbers(spawn, attention, ffn, transport):
    from vllm_runner import HIDDEN, LAYERS, STAGES, STEPS, token_counts

    out = finish(start_job(spawn, attention, ffn, {"transport": transport}))
    rows = [LAYERS * sum(token_counts(step, stage, attention)[a] for step in range(STEPS)
                         for stage in STAGES) for a in range(attention)]
    row_bytes = HIDDEN * 2  # bf16; no routing travels (top_k = 0: the F computes the gate)
    for a in range(attention):
        line = out["attention", a]
        assert f"attention {a}: verified {STEPS} steps" in line, line
        moved = counters(line)
        # Every byte sent from and received into its own two tensors, registered by the pages
        # they span (1 KiB each: one to four pages in all); none from the engine's memory.
        assert moved["caller_bytes"] == rows[a] * row_bytes * 2, moved
        assert moved["slot_bytes"] == 0, moved
        assert moved["staged_bytes"] == 0 and 1 <= moved["caller_buffers"] <= 4, moved
        # Sent without Python but those from Python; every answer received without Python but
        # the first layer's (the sends of both stages came before their first answer settled).
        exchanges = STEPS * LAYERS * len(STAGES)
        by_python = from_python(lambda step, stage: token_counts(step, stage, attention)[a])
        assert moved["sends_from_cpp"] == exchanges - by_python, moved
        assert moved["receives_from_cpp"] == exchanges - len(STAGES), moved
    ratio = attention // ffn
    exchanges = STEPS * LAYERS * len(STAGES)
    for f in range(ffn):
        line = out["ffn", f]
        assert f"ffn {f}: served {STEPS} steps; in place {exchanges}/{exchanges}" in line, line
        group_rows = sum(rows[f * ratio:(f + 1) * ratio])
        moved = counters(line)
        # Responded from its own output tensors; its As' rows landed back to back in its row
        # spaces, one tensor in place (no torch.cat).
        assert moved["caller_bytes"] == group_rows * row_bytes, moved
        assert moved["slot_bytes"] == group_rows * row_bytes, moved
        # Every batch handed out without Python; every answer too, but those from Python.
        by_python = from_python(lambda step, stage: sum(
            token_counts(step, stage, attention)[f * ratio:(f + 1) * ratio]))
        assert moved["batches_from_cpp"] == exchanges, moved
        assert moved["answers_from_cpp"] == exchanges - by_python, moved


@pytest.mark.parametrize("attention,ffn,transport", [(2, 1, "ipc"), (4, 2, "tcp")])
def test_router_logits_travel_on_moe_layers_beside_the_hidden_states(spawn, attention, ffn,
                                                                      transport):
    from vllm_runner import LAYERS, STAGES, STEPS

    options = {"transport": transport, "router_logits_width": 4,
               "router_logits_dtype": "float32"}
    extra = {(role, r): {"logits": True} for role, n in (("attention", attention), ("ffn", ffn))
             for r in range(n)}
    out = finish(start_job(spawn, attention, ffn, options, extra))
    for a in range(attention):
        assert f"attention {a}: verified {STEPS} steps" in out["attention", a]
    moe = STEPS * (LAYERS - 1) * len(STAGES)  # layer 0 is dense: no logits
    exchanges = STEPS * LAYERS * len(STAGES)
    for f in range(ffn):
        assert (f"ffn {f}: served {STEPS} steps; in place {exchanges}/{exchanges}; logits right "
                f"{moe}") in out["ffn", f], out["ffn", f]


@pytest.mark.parametrize("attention,ffn,transport,logits", [(1, 1, "ipc", False),
                                                             (2, 1, "tcp", True),
                                                             (4, 2, "ipc", False)])
def test_round_trips_the_device_rings_get_the_one_process_numbers(spawn, attention, ffn,
                                                                  transport, logits):
    """device_trigger: every call only enqueues on a stream (the cpu plugin's are threads with
    the same stream memory operations), as a CUDA graph would replay them (ci/gpu captures them)."""
    from vllm_runner import HIDDEN, LAYERS, STAGES, STEPS, token_counts

    options = {"transport": transport, "device_trigger": True}
    if logits:
        options.update(router_logits_width=4, router_logits_dtype="float32")
    extra = {(role, r): {"logits": logits} for role, n in (("attention", attention), ("ffn", ffn))
             for r in range(n)}
    out = finish(start_job(spawn, attention, ffn, options, extra))
    exchanges = STEPS * LAYERS * len(STAGES)
    for a in range(attention):
        line = out["attention", a]
        assert f"attention {a}: verified {STEPS} steps" in line, line
        assert f"device rang {exchanges} completed {exchanges} failed 0" in line, line
        moved = counters(line)
        if logits:  # through its slots
            assert moved["caller_bytes"] == 0 and moved["slot_bytes"] > 0, moved
        else:  # each stage's tensor armed as a layout of its own: sent and answered in place
            rows = LAYERS * sum(token_counts(step, stage, attention)[a] for step in range(STEPS)
                                for stage in STAGES)
            assert moved["caller_bytes"] == rows * HIDDEN * 2 * 2, moved
            assert moved["slot_bytes"] == 0, moved
    ratio = attention // ffn
    moe = STEPS * (LAYERS - 1) * len(STAGES) if logits else 0  # layer 0 is dense
    for f in range(ffn):
        line = out["ffn", f]
        # One A's rows are a view of the engine's; several As' windows are copied together.
        in_place = exchanges if ratio == 1 else 0
        assert (f"ffn {f}: served {STEPS} steps; in place {in_place}/{exchanges}; logits right "
                f"{moe}") in line, line
        assert f"device rang {exchanges} completed {exchanges} failed 0" in line, line


def test_a_killed_ffn_fails_the_round_trips_its_group_rang_by_name(spawn):
    from vllm_runner import STEPS

    # F 1's group: attention 2 checks before it uses a step's output, attention 3 does not (its
    # next step's control plane raises).
    instances = start_job(spawn, 4, 2, {"device_trigger": True},
                          {("ffn", 1): {"die_at": (2, 1, 0)},
                           ("attention", 3): {"check_each_step": False}})
    victim = instances.pop(("ffn", 1))
    out = finish(instances)
    assert victim.finish()[0] == -9
    for rank in (2, 3):  # their streams went on; the check names the F
        line = out["attention", rank]
        assert (f"attention {rank}: lost ffn:1: hetmesh connector (attention {rank}): "
                in line and "its device rang failed since the last check; the earliest reason "
                "kept: micro-batch" in line and "ffn 1 lost: " in line), line
    for rank in (0, 1):
        assert f"attention {rank}: verified {STEPS} steps" in out["attention", rank], out
    assert f"ffn 0: served {STEPS} steps" in out["ffn", 0], out


@pytest.mark.parametrize("device_trigger", [False, True])
def test_a_killed_attention_is_named_by_its_ffn_and_its_group_mate_ends(spawn, device_trigger):
    """An A of a group dies with its stages sent: its F raises PeerLostError naming it, though
    the group-mate still sends, and the group-mate then names its F's loss; the other group
    finishes."""
    from vllm_runner import STEPS

    instances = start_job(spawn, 4, 2, {"device_trigger": device_trigger},
                          {("attention", 3): {"die_at": (2, 1)}})
    victim = instances.pop(("attention", 3))
    out = finish(instances)
    assert victim.finish()[0] == -9
    line = out["ffn", 1]
    assert "ffn 1: lost attention:3 after " in line and "attention 3 lost: " in line, line
    # In the step it died in (the batch short of it), or with device_trigger at the next step's
    # control message (the F's stream does not look at its batches).
    assert f"ffn 1: lost attention:3 after {3 if device_trigger else 2} steps: " in line, line
    assert "attention 2: lost ffn:1: " in out["attention", 2], out["attention", 2]
    for rank in (0, 1):
        assert f"attention {rank}: verified {STEPS} steps" in out["attention", rank], out
    assert f"ffn 0: served {STEPS} steps" in out["ffn", 0], out


CUDA = any(d["plugin"] == "cuda" for d in hetmesh.devices()) and torch.cuda.is_available()


@pytest.mark.skipif(not CUDA, reason="needs the cuda plugin's device and a CUDA torch")
@pytest.mark.parametrize("attention,ffn_device", [(1, "cuda:0"), (2, "cpu:0"), (2, "cuda:0")])
def test_the_plugins_graph_runners_replay_with_the_one_process_numbers(spawn, attention,
                                                                       ffn_device):
    """FULL_DECODE_ONLY: each A captures its forward per batch size, the F on cuda its loop per
    token-count key (an F on the host runs each step eagerly); every replayed step's numbers are
    those of the layers computed in one process, and no round trip the device rang failed."""
    from vllm_runner import GRAPH_SIZES, LAYERS, STAGES, STEPS

    on_cuda = ffn_device == "cuda:0"
    extra = {("ffn", 0): {"graphs": on_cuda}}  # the As' counts differ: the F's windows
    out = finish(start_job(spawn, attention, 1, {"device_trigger": True}, extra,
                           devices={"attention": "cuda:0", "ffn": ffn_device},
                           attention_runner="attention_graphs"))
    warmups = len(GRAPH_SIZES)
    exchanges = (STEPS + warmups) * LAYERS * len(STAGES)
    for a in range(attention):
        line = out["attention", a]
        assert (f"attention {a}: verified {STEPS} steps x {LAYERS} layers x {len(STAGES)} "
                f"stages, {STEPS} replayed from {warmups} graphs; device rang {exchanges} "
                f"completed {exchanges} failed 0") in line, line
    line = out["ffn", 0]
    assert f"ffn 0: served {STEPS + warmups} steps" in line, line
    assert f"device rang {exchanges} completed {exchanges} failed 0" in line, line
    assert f"replayed {STEPS if on_cuda else 0}" in line, line


@pytest.mark.skipif(not CUDA, reason="needs the cuda plugin's device and a CUDA torch")
@pytest.mark.parametrize("ffn_device", ["cpu:0", "cuda:0"])
def test_an_attention_on_cuda_gets_the_one_process_numbers(spawn, ffn_device):
    from vllm_runner import HIDDEN, LAYERS, STAGES, STEPS, token_counts

    out = finish(start_job(spawn, 2, 1, devices={"attention": "cuda:0", "ffn": ffn_device}))
    for a in range(2):
        line = out["attention", a]
        assert f"attention {a}: verified {STEPS} steps" in line, line
        # torch's CUDA memory is not the cuda plugin's own, and the plugin exports it all the same
        # (HM-R36): every byte in place, as on the CPU, none staged and none through the slots.
        moved = counters(line)
        rows = LAYERS * sum(token_counts(step, stage, 2)[a] for step in range(STEPS)
                            for stage in STAGES)
        assert moved["caller_bytes"] == rows * HIDDEN * 2 * 2, moved
        assert moved["staged_bytes"] == 0 and moved["slot_bytes"] == 0, moved
    assert f"ffn 0: served {STEPS} steps" in out["ffn", 0]


def test_a_killed_ffn_is_named_by_its_attention_group_and_the_other_group_finishes(spawn):
    from vllm_runner import STEPS

    instances = start_job(spawn, 4, 2, extra={("ffn", 1): {"die_at": (2, 1, 0)}})
    victim = instances.pop(("ffn", 1))
    out = finish(instances)
    assert victim.finish()[0] == -9
    for rank in (2, 3):  # F 1's group
        line = out["attention", rank]
        assert f"attention {rank}: lost ffn:1: " in line and "failed: ffn 1 lost: " in line, line
    for rank in (0, 1):
        assert f"attention {rank}: verified {STEPS} steps" in out["attention", rank], out
    assert f"ffn 0: served {STEPS} steps" in out["ffn", 0], out


def test_tensors_at_new_addresses_every_step_go_through_the_slots_after_the_bound(spawn):
    from vllm_runner import STEPS

    instances = start_job(spawn, 1, 1, {"max_buffers": 3},
                          extra={("attention", 0): {"fresh_tensors": True}})
    code, out, err = instances["attention", 0].finish()
    assert code == 0, err
    assert f"attention 0: verified {STEPS} steps" in out, out
    moved = counters(out)
    assert 1 <= moved["caller_buffers"] <= 3 and moved["slot_bytes"] > 0, moved
    assert "came from more than 3 allocations" in err and "copying such ones through" in err, err
    assert finish({k: v for k, v in instances.items() if k[0] == "ffn"})


def test_stages_sent_in_reverse_are_served_in_the_runners_order(spawn):
    from vllm_runner import STEPS

    # The As send (and wait for) stage 1 before stage 0; the F's runner asks for stage 0 first, so
    # stage 1's batch waits for its turn (and the F checks each stage's token counts).
    out = finish(start_job(spawn, 2, 1, extra={("attention", a): {"reverse_stages": True}
                                               for a in range(2)}))
    for a in range(2):
        assert f"attention {a}: verified {STEPS} steps" in out["attention", a], out


def test_a_control_message_that_is_not_one_is_a_protocol_error_naming_its_sender():
    # A peer that passed the job's secret and then sends nonsense on the side band.
    store = f"127.0.0.1:{free_port()}"
    shape = dict(attention=1, ffn=1, hidden=8, dtype=torch.bfloat16, max_tokens=4,
                 default_store=store, options={"device": "cpu:0", "job": "hostile"})
    f = vllm_afd.AfdConnector(role="ffn", role_rank=0, **shape)
    a = vllm_afd.AfdConnector(role="attention", role_rank=0, **shape)
    joined = threading.Thread(target=f.init_afd_connector)
    joined.start()  # F 0 hosts the store, then waits for the A
    try:
        a.init_afd_connector()
        joined.join(120)
        for bad in (b"not json", b"[]", b'{"stages": {"0": ["x"]}, "capturing": false}',
                    b'{"stages": {"0": [1]}, "capturing": false, "warmup": false}'):
            a.engine.send_message(0, bad)
            with pytest.raises(hetmesh.ProtocolError,
                               match="attention 0 sent a control message that is not one"):
                f.control_plane.recv_dp_metadata_list()
        # An A with device_trigger, this F without: its rows would land in windows.
        a.engine.send_message(0, b'{"stages": {"0": [1]}, "capturing": false, "warmup": false, '
                                 b'"device": true}')
        with pytest.raises(hetmesh.ProtocolError, match="attention 0 runs with device_trigger on, "
                                                        "this F with it off"):
            f.control_plane.recv_dp_metadata_list()
        # A good one after them still arrives.
        payload = vllm_afd.ControlPayload({0: vllm_afd.DPMetadata(torch.tensor([3]))})
        a.control_plane.send_dp_metadata_list(payload)
        got = f.control_plane.recv_dp_metadata_list()
        assert got.dp_metadata_list[0].num_tokens_across_dp_cpu.tolist() == [3]
    finally:
        a.close()
        joined.join(120)
        f.close()


def test_an_ffn_holds_each_tensor_it_answered_from_until_that_stage_comes_again():
    # The engine sends an answer after send_ffn_output returns, and the model drops its output
    # tensor then: a caching allocator would give its memory to the next layer's kernels. Step 0
    # answers 2 rows a stage (the first from Python, the rest from C++), step 1 3 rows (more than
    # before: from Python, learnt at once, then from C++).
    store = f"127.0.0.1:{free_port()}"
    shape = dict(attention=1, ffn=1, hidden=8, dtype=torch.bfloat16, max_tokens=4,
                 default_store=store, options={"device": "cpu:0", "job": "hold"})
    f = vllm_afd.AfdConnector(role="ffn", role_rank=0, **shape)
    a = vllm_afd.AfdConnector(role="attention", role_rank=0, **shape)
    joined = threading.Thread(target=f.init_afd_connector)
    joined.start()
    try:
        a.init_afd_connector()
        joined.join(120)
        stages = (0, 1)
        space = {stage: torch.zeros(4, 8, dtype=torch.bfloat16) for stage in stages}
        for tensor in space.values():
            f.engine.register_buffer(tensor)  # the engine holds this, not the views below
        answered = {}
        for step, rows in enumerate((2, 3)):
            payload = vllm_afd.ControlPayload({stage: vllm_afd.DPMetadata(
                torch.tensor([rows], dtype=torch.int32)) for stage in stages})
            a.control_plane.update_state_from_dp_metadata(payload)
            a.control_plane.send_dp_metadata_list(payload)
            f.control_plane.update_state_from_dp_metadata(f.control_plane.recv_dp_metadata_list())
            x = {stage: torch.full((rows, 8), stage + 1.0, dtype=torch.bfloat16)
                 for stage in stages}
            for layer in range(3):
                for stage in stages:
                    metadata = vllm_afd.TransferMetadata(layer, stage, [rows])
                    a.send_attn_output(x[stage], vllm_afd.TransferContext(metadata))
                for stage in stages:
                    got = f.recv_attn_output(stage)
                    if stage in answered:  # its As have the last answer: it is let go
                        refs = sys.getrefcount(answered[stage])
                        assert refs == 2, (step, layer)  # the dict's and the call's
                    out = torch.mul(got.hidden_states, 2, out=space[stage][:rows])
                    before = sys.getrefcount(out)
                    f.send_ffn_output(out, got.context)
                    after = sys.getrefcount(out)
                    assert after > before, (step, layer)  # held by the connector
                    answered[stage] = out
                for stage in stages:
                    a.recv_ffn_output(x[stage], stage)
                    want = torch.full((rows, 8), (stage + 1.0) * 2 ** (layer + 1),
                                      dtype=torch.bfloat16)
                    assert torch.equal(x[stage], want), (step, layer, stage)
                del out
        # Of 12 answers, each stage's first and its first of 3 rows went through Python.
        assert f.counters()["answers_from_cpp"] == 8, f.counters()
        # An A's sends from C++ follow the step's counts: rows the counts do not give are
        # refused, not sent over a group-mate's.
        assert a.counters()["sends_from_cpp"] == 8, a.counters()
        metadata = vllm_afd.TransferMetadata(3, 0, [3])
        for counts, match in (([2], "stage 0 sends 3 rows, but this step's control payload "
                               "gives 1 counts"),
                              ([3, 3], "gives 2 counts \\[3, 3\\] for 1 attention ranks")):
            a.control_plane.update_state_from_dp_metadata(vllm_afd.ControlPayload(
                {0: vllm_afd.DPMetadata(torch.tensor(counts, dtype=torch.int32))}))
            with pytest.raises(ValueError, match=match):
                a.send_attn_output(x[0], vllm_afd.TransferContext(metadata))
        assert a.counters()["sends_from_cpp"] == 8, a.counters()
    finally:
        a.close()
        joined.join(120)
        f.close()


def test_options_and_payloads_it_cannot_serve_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown key 'timout_ms' \\(did you mean 'timeout_ms'"):
        vllm_afd.parse_options({"timout_ms": 5})
    with pytest.raises(TypeError, match="micro_batches='2': expected int"):
        vllm_afd.parse_options({"micro_batches": "2"})
    shape = dict(role="attention", role_rank=0, hidden=8, dtype=torch.bfloat16, max_tokens=4)
    with pytest.raises(hetmesh.InvalidArgumentError, match="3 attention ranks do not divide"):
        vllm_afd.AfdConnector(attention=3, ffn=2, **shape)
    with pytest.raises(hetmesh.NotSupportedError, match="hidden states of torch.int8"):
        vllm_afd.AfdConnector(attention=1, ffn=1, **{**shape, "dtype": torch.int8})
    c = vllm_afd.AfdConnector(attention=1, ffn=1, **shape)
    with pytest.raises(hetmesh.NotSupportedError, match="CUDA graph capture needs device-trig"):
        c.control_plane.update_state_from_dp_metadata(
            vllm_afd.ControlPayload({}, is_graph_capturing=True))
    context = vllm_afd.TransferContext(vllm_afd.TransferMetadata(0, 0, [1]))
    x = torch.zeros(1, 8, dtype=torch.bfloat16)
    # Router logits travel only where the job declares them (router_logits_width); top-k ids and
    # weights never: refused, not dropped.
    with pytest.raises(hetmesh.NotSupportedError, match="router_logits travel only where"):
        c.send_attn_output(x, context, router_logits=torch.zeros(1, 4))
    with pytest.raises(hetmesh.NotSupportedError,
                       match="send_attn_output cannot carry topk_ids, topk_weights"):
        c.send_attn_output(x, context, topk_weights=torch.ones(1, 2), topk_ids=torch.ones(1, 2))
    with pytest.raises(hetmesh.NotSupportedError, match="router_logits travel only where"):
        c.recv_attn_output(0, routing_spec=RoutingSpec(4, torch.float32))
    gated = vllm_afd.AfdConnector(attention=1, ffn=1, options={"router_logits_width": 4}, **shape)
    with pytest.raises(hetmesh.NotSupportedError, match="the layer asks for 8 torch.float32"):
        gated.recv_attn_output(0, routing_spec=RoutingSpec(8, torch.float32))
    with pytest.raises(hetmesh.ClosedError, match="not initialized"):
        c.send_attn_output(x, context)
    c.close()
    c.close()  # again, and after no initialization


def test_an_attention_pushes_after_its_group_mates_by_the_steps_counts():
    shape = dict(hidden=8, dtype=torch.bfloat16, max_tokens=8)
    c = vllm_afd.AfdConnector(role="attention", role_rank=3, attention=4, ffn=2, **shape)
    plane = c.control_plane
    assert plane.row_offset(0, 3) is None  # no counts yet: its own window
    counts = {0: [5, 3, 2, 4], 1: [1, 1, 6, 0]}
    plane.update_state_from_dp_metadata(vllm_afd.ControlPayload(
        {stage: vllm_afd.DPMetadata(torch.tensor(n, dtype=torch.int32))
         for stage, n in counts.items()}))
    # Rank 3 is the second of F 1's group (ranks 2, 3): after rank 2's rows.
    assert plane.row_offset(0, 4) == 2 and plane.row_offset(1, 0) == 6
    # Rows that are not what the counts say would land over the group's: refused, not sent.
    with pytest.raises(ValueError, match="stage 0 sends 3 rows, but this step's control payload"):
        plane.row_offset(0, 3)
