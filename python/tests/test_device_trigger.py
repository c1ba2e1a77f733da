"""Round trips a device triggers, from Python: the A's stream rings and waits (enqueue_push_pull,
enqueue_wait) and the F's stream waits for each batch and rings its answer (serve_device,
enqueue_wait_batch, enqueue_respond), the same operations with the same values every replay, one
synchronize per step and no engine call per layer. The cpu plugin's streams are threads with
stream memory operations, so this runs without a GPU; ci/gpu captures the same calls in a CUDA
graph."""

import pytest
import torch

import hetmesh

# F: its outputs hold 5 (bf16) once; its stream answers every batch from them, step after step,
# until the engine says the job is over for it (the A left).
DEVICE_FFN = """
import torch, hetmesh
job = {job!r}
f = hetmesh.FfnEngine(rank=0, store={store!r}, **job)
for mb in range(job["micro_batches"]):
    torch.from_dlpack(f.outputs(mb)).fill_(5)
f.serve_device()
s = f.create_stream()
while not f.device_trips().ended:
    for mb in range(job["micro_batches"]):
        f.enqueue_wait_batch(mb, s)
        f.enqueue_respond(mb, s)
    s.synchronize(timeout_ms=60000)
t = f.device_trips()
print("raised", t.completed, "ended:", t.ended, flush=True)
f.finish()
"""


def test_a_step_of_rings_and_waits_replays_with_every_answer_in_place(store, job, spawn):
    ffn = spawn(DEVICE_FFN.format(job=job, store=store.address))
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        send = torch.ones(job["tokens"], job["hidden"], dtype=torch.bfloat16)
        into = torch.zeros(job["tokens"], job["hidden"], dtype=torch.bfloat16)
        a.arm_device(0, send=send, results_into=into)
        a.arm_device(1)  # from its slots
        with pytest.raises(hetmesh.InvalidArgumentError, match="armed for its device"):
            a.push_pull(0)
        result = torch.from_dlpack(a.result(1, 0))
        s = a.create_stream()
        for replay in range(50):
            rows = 3 + replay % 5  # the count rides on the ring
            into.zero_()
            result.zero_()
            a.enqueue_push_pull(0, rows, s)
            a.enqueue_push_pull(1, job["tokens"], s)
            a.enqueue_wait(0, s)
            a.enqueue_wait(1, s)
            s.synchronize(timeout_ms=60000)
            assert torch.all(into[:rows] == 5) and torch.all(into[rows:] == 0), replay
            assert torch.all(result == 5), replay
        trips = a.device_trips()
        assert (trips.rung, trips.completed, trips.failed, trips.ended) == (100, 100, 0, "")
    code, out, err = ffn.finish()
    assert code == 0, err
    assert "raised 100 ended: ffn 0: every attention instance left or was lost" in out, out + err


def test_the_device_calls_are_refused_by_name(store, job, spawn):
    spawn(DEVICE_FFN.format(job=job, store=store.address))
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        s = a.create_stream()
        with pytest.raises(hetmesh.InvalidArgumentError, match="micro-batch 0 is not armed"):
            a.enqueue_push_pull(0, 1, s)
        with pytest.raises(hetmesh.InvalidArgumentError, match="micro-batch 7: the engine has 2"):
            a.arm_device(7)
        with pytest.raises(hetmesh.InvalidArgumentError, match="name the stream"):
            a.enqueue_wait(0, None)
        a.arm_device(0)
        with pytest.raises(hetmesh.InvalidArgumentError, match="9 tokens"):
            a.enqueue_push_pull(0, 9, s)
        a.enqueue_push_pull(0, 1, s)
        a.enqueue_wait(0, s)
        s.synchronize(timeout_ms=60000)
        assert a.device_trips().completed == 1


def test_each_ring_sends_the_layout_it_names(store, job, spawn):
    # Micro-batch 0's layout 0 sends from the slots, layouts 1 and 2 from and into tensors of
    # their own (a graph's layers); every ring names one, and its answer lands where it says.
    # Micro-batch 1 goes along from its slots (the F's stream serves both in turn).
    spawn(DEVICE_FFN.format(job=job, store=store.address))
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        own = [torch.ones(job["tokens"], job["hidden"], dtype=torch.bfloat16) for _ in range(2)]
        a.arm_device(0)
        a.arm_device(1)
        for layout, tensor in enumerate(own, start=1):
            a.arm_device(0, send=tensor, results_into=tensor, layout=layout)
        with pytest.raises(hetmesh.InvalidArgumentError, match=r"layout 64 \(0..63\)"):
            a.arm_device(0, layout=64)
        s = a.create_stream()
        with pytest.raises(hetmesh.InvalidArgumentError, match="not armed with layout 3"):
            a.enqueue_push_pull(0, 1, s, layout=3)
        result = torch.from_dlpack(a.result(0, 0))
        result.zero_()
        for layout, rows in ((1, 3), (2, 5), (0, 2)):
            a.enqueue_push_pull(0, rows, s, layout=layout)
            a.enqueue_push_pull(1, 1, s)
            a.enqueue_wait(0, s)
            a.enqueue_wait(1, s)
        s.synchronize(timeout_ms=60000)
        assert torch.all(own[0][:3] == 5) and torch.all(own[0][3:] == 1)
        assert torch.all(own[1][:5] == 5) and torch.all(own[1][5:] == 1)
        assert torch.all(result[:2] == 5) and torch.all(result[2:] == 0)
        trips = a.device_trips()
        assert (trips.rung, trips.completed, trips.failed) == (6, 6, 0)
