"""Every slot is the engine's own registered memory, seen through DLPack with no copy: the data
pointers are the slots', a write through a tensor is what the peer receives, and the shapes and
dtypes follow the job."""

import gc
import sys
import threading
import weakref

import numpy
import pytest
import torch

import hetmesh
from conftest import doubling_ffn, serve


def test_a_write_through_the_tensor_is_what_the_ffn_gets_and_answers(store, job, spawn):
    ffn = doubling_ffn(spawn, store, job)
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        for mb in range(job["micro_batches"]):
            slot = a.tokens(mb)
            tokens = torch.from_dlpack(slot)
            assert tokens.data_ptr() == slot.data_ptr  # the slot itself, not a copy
            tokens.copy_(torch.arange(tokens.numel(), dtype=torch.uint8).reshape(tokens.shape)
                         + mb)
            torch.from_dlpack(a.experts(mb)).fill_(0)
            a.wait(a.push_pull(mb))
            result = torch.from_dlpack(a.result(mb, 0))
            assert result.data_ptr() == a.result(mb, 0).data_ptr
            assert torch.equal(result, (tokens.float() * 2).to(torch.bfloat16))
    code, out, err = ffn.finish()
    assert code == 0, err
    assert f"served {job['micro_batches']}" in out


def test_a_push_of_fewer_tokens_sends_only_those_rows(store, job, spawn):
    ffn = spawn(f"""
import torch, hetmesh
f = hetmesh.FfnEngine(rank=0, store={store.address!r}, **{job!r})
batch = f.get_batch()
part = batch.parts[0]
print("count", part.count, tuple(part.tokens.shape), tuple(part.output.shape), flush=True)
torch.from_dlpack(part.output).fill_(1)
f.respond(batch)
assert f.get_batch() is None
""")
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        a.wait(a.push_pull(0, tokens=3))
    code, out, err = ffn.finish()
    assert code == 0, err
    assert f"count 3 (3, {job['hidden']}) (3, {job['hidden']})" in out


@pytest.mark.parametrize("a2f, f2a, a2f_torch, f2a_torch", [
    ("fp8", "bf16", torch.uint8, torch.bfloat16),
    ("bf16", "fp32", torch.bfloat16, torch.float32),
    ("fp16", "fp16", torch.float16, torch.float16),
])
def test_shapes_and_dtypes_follow_the_job(store, job, a2f, f2a, a2f_torch, f2a_torch):
    job.update(a2f_dtype=a2f, f2a_dtype=f2a, tokens=5, hidden=24, top_k=2, ffn=1)
    f_done = threading.Event()

    def ffn():  # in a thread of this process: the engines release the GIL while they wait
        f = hetmesh.FfnEngine(rank=0, store=store.address, **job)
        for batch in f.batches():
            part = batch.parts[0]
            assert torch.from_dlpack(part.tokens).dtype == a2f_torch
            assert torch.from_dlpack(part.output).dtype == f2a_torch
            assert torch.from_dlpack(part.experts).tolist() == [[3, 1]] * 5
            assert torch.from_dlpack(part.weights).tolist() == [[0.25, 0.75]] * 5
            f.respond(batch)
        f_done.set()

    thread = threading.Thread(target=ffn)
    thread.start()
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    tokens = a.tokens(0)
    assert tokens.shape == (5, 24)
    assert tokens.dtype == {"fp8": "fp8", "bf16": "bfloat16", "fp16": "float16"}[a2f]
    assert torch.from_dlpack(tokens).dtype == a2f_torch
    result = torch.from_dlpack(a.result(0, 0))
    assert result.shape == (5, 24) and result.dtype == f2a_torch
    experts, weights = torch.from_dlpack(a.experts(0)), torch.from_dlpack(a.weights(0))
    assert experts.dtype == torch.int32 and weights.dtype == torch.float32
    assert experts.shape == weights.shape == (5, 2)
    # {int32 expert, float weight} pairs: two strided views of the same bytes, interleaved.
    assert experts.stride() == weights.stride() == (4, 2)
    assert weights.data_ptr() == experts.data_ptr() + 4
    experts[:, 0], experts[:, 1] = 3, 1
    weights[:, 0], weights[:, 1] = 0.25, 0.75
    a.wait(a.push_pull(0))
    a.finish()
    thread.join(30)
    assert f_done.is_set()


def test_numpy_sees_the_same_bytes(store, job):
    job.update(ffn=1, a2f_dtype="fp16")  # numpy has no bfloat16
    serve(store, job)
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    view = numpy.from_dlpack(a.tokens(1))
    assert view.ctypes.data == a.tokens(1).data_ptr and view.shape == (8, 16)
    torch.from_dlpack(a.tokens(1)).fill_(7)
    assert (view == 7).all()
    assert a.tokens(1).__dlpack_device__() == (1, 0)  # kDLCPU: the cpu plugin's memory
    a.finish()


def test_a_tensor_keeps_its_engine_alive_and_lets_it_go(store, job):
    serve(store, job)
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    engine = weakref.ref(a)
    tokens = torch.from_dlpack(a.tokens(0))
    tokens.fill_(9)
    a.finish()
    del a
    gc.collect()
    assert engine() is not None  # the tensor holds it, so its memory is still mapped
    assert int(tokens.sum()) == 9 * tokens.numel()
    del tokens
    gc.collect()
    assert engine() is None  # the last tensor gone, the engine went


def test_an_engine_that_keeps_its_own_slots_is_still_collected(store, job):
    class Keeper(hetmesh.AttentionEngine):
        pass

    serve(store, job)
    a = Keeper(rank=0, store=store.address, **job)
    a.slots = [a.tokens(0), a.result(0, 0)]  # a cycle: the engine holds slots that hold it
    a.stream = a.create_stream()
    a.finish()
    engine = weakref.ref(a)
    del a
    gc.collect()
    assert engine() is None


def test_capsules_and_tensors_give_their_reference_back(store, job):
    serve(store, job)
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    before = sys.getrefcount(a)
    tensors = [torch.from_dlpack(a.tokens(0)) for _ in range(10)]
    assert sys.getrefcount(a) == before + 10  # each tensor holds the engine
    del tensors
    for _ in range(100):
        a.tokens(0).__dlpack__()  # a capsule nobody consumed frees its tensor
    gc.collect()
    assert sys.getrefcount(a) == before
    a.finish()


def test_slot_indices_are_checked(store, job):
    serve(store, job)
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    with pytest.raises(hetmesh.InvalidArgumentError, match=r"micro-batch 2: the engine has 2"):
        a.tokens(2)
    with pytest.raises(hetmesh.InvalidArgumentError, match=r"ffn 1: the job has 1"):
        a.result(0, 1)
    a.finish()


def test_memory_no_framework_can_address_is_refused_by_name(store, job):
    """asic_stub simulates an accelerator whose memory the host cannot address (kDLExtDev):
    DLPack has no consumer for it, so the export says so instead of handing out a pointer that
    would crash the first read."""
    job["ffn_devices"] = "asic_stub:0"
    def attention():
        a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
        a.wait(a.push_pull(0))
        a.finish()

    threading.Thread(target=attention, daemon=True).start()
    f = hetmesh.FfnEngine(rank=0, store=store.address, **job)
    batch = f.get_batch()
    assert batch.parts[0].tokens.__dlpack_device__() == (12, 0)  # kDLExtDev, asic_stub:0
    with pytest.raises(hetmesh.NotSupportedError, match="kDLExtDev"):
        torch.from_dlpack(batch.parts[0].tokens)
    # The stream helpers' private calls (hetmesh.stepmesh's write_flag and wait_flag) take
    # addresses: a stray one is refused before a copy engine or the watcher thread touches it.
    stream, stray = f.create_stream(), 0x1000
    with pytest.raises(hetmesh.InvalidArgumentError,
                       match=r"write_flag: the flag at 0x1000 \(8 bytes\) is not memory asic_stub:0"):
        f._enqueue_copy(stray, stray, 8, stream)
    with pytest.raises(hetmesh.InvalidArgumentError,
                       match="wait_flag: the flag at 0x1000 is not host memory that asic_stub:0"):
        f._enqueue_flag_wait(stray, stray, stream, True)
    f.respond(batch)
    assert f.get_batch() is None  # respond() only queues: the engine lives until every A left
