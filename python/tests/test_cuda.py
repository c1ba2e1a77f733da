"""On a CUDA device (the GPU machine; skipped elsewhere): an attention engine's slots are CUDA
tensors over the engine's own device memory, torch's work on the engine's stream orders the push,
and what the FFN on the CPU gets is what torch wrote."""

import threading

import pytest
import torch

import hetmesh

CUDA = any(d["plugin"] == "cuda" for d in hetmesh.devices())
pytestmark = pytest.mark.skipif(not CUDA or not torch.cuda.is_available(),
                                reason="needs the cuda plugin's device and a CUDA torch")


def test_slots_are_cuda_tensors_of_the_engines_memory_and_the_stream_orders_the_push(store, job):
    job.update(attention_devices="cuda:0", ffn_devices="cpu:0", a2f_dtype="bf16")
    got = {}

    def ffn():
        f = hetmesh.FfnEngine(rank=0, store=store.address, **job)
        for batch in f.batches():
            part = batch.parts[0]
            tokens = torch.from_dlpack(part.tokens)
            got["tokens"] = tokens.clone()
            torch.from_dlpack(part.output).copy_(tokens * 3)
            f.respond(batch)

    thread = threading.Thread(target=ffn)
    thread.start()
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    slot = a.tokens(0)
    assert slot.__dlpack_device__() == (2, 0)  # kDLCUDA, device 0
    tokens = torch.from_dlpack(slot)
    assert tokens.is_cuda and tokens.data_ptr() == slot.data_ptr
    stream = a.create_stream()
    assert stream.native_handle  # the cudaStream_t behind the engine's stream
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.native_handle)):
        torch.cuda._sleep(50_000_000)  # a kernel still running when push_pull is called
        tokens.copy_(torch.arange(tokens.numel(), device="cuda").reshape(tokens.shape) % 64)
    a.wait(a.push_pull(0, stream=stream))  # sends once the stream's work is done
    expected = (torch.arange(tokens.numel()).reshape(tokens.shape) % 64).to(torch.bfloat16)
    assert torch.equal(got["tokens"], expected)
    result = torch.from_dlpack(a.result(0, 0))
    assert result.is_cuda and torch.equal(result.cpu(), expected * 3)
    a.finish()
    thread.join(30)


def test_a_torch_stream_is_borrowed_and_orders_the_push(store, job):
    job.update(attention_devices="cuda:0", ffn_devices="cpu:0", a2f_dtype="bf16")
    got = {}

    def ffn():
        f = hetmesh.FfnEngine(rank=0, store=store.address, **job)
        for batch in f.batches():
            got.setdefault("tokens", []).append(torch.from_dlpack(batch.parts[0].tokens).clone())
            f.respond(batch)

    thread = threading.Thread(target=ffn)
    thread.start()
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    tokens = torch.from_dlpack(a.tokens(0))
    s = torch.cuda.Stream()
    for value in (5, 7):  # the same torch stream twice: borrowed once, used twice
        with torch.cuda.stream(s):
            torch.cuda._sleep(50_000_000)
            tokens.fill_(value)
        a.wait(a.push_pull(0, stream=s))
    a.wait(a.push_pull(0, stream=s.cuda_stream))  # its raw handle, as an int
    a.finish()
    thread.join(30)
    assert [int(t[0, 0]) for t in got["tokens"]] == [5, 7, 7]


def test_a_torch_stream_waits_for_the_results_without_the_host(store, job):
    job.update(attention_devices="cuda:0", ffn_devices="cpu:0", a2f_dtype="bf16")
    answer = threading.Event()

    def ffn():
        f = hetmesh.FfnEngine(rank=0, store=store.address, **job)
        for batch in f.batches():
            tokens = torch.from_dlpack(batch.parts[0].tokens)
            torch.from_dlpack(batch.parts[0].output).copy_(tokens * 3)
            answer.wait(30)  # held until the GPU's work has been queued behind the wait
            f.respond(batch)

    thread = threading.Thread(target=ffn)
    thread.start()
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    torch.from_dlpack(a.tokens(0)).fill_(2)
    result = torch.from_dlpack(a.result(0, 0))
    result.zero_()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    h = a.push_pull(0)
    a.stream_wait(h, s)
    with torch.cuda.stream(s):
        seen = result.clone()  # queued behind the wait: runs once the results are in
    done = torch.cuda.Event()
    done.record(s)
    assert not done.query()  # the stream is held: the F has not answered
    answer.set()
    done.synchronize()
    assert torch.equal(seen.cpu(), torch.full(seen.shape, 6, dtype=torch.bfloat16))
    a.wait(h)
    a.finish()
    thread.join(30)


def test_an_a_on_cuda_sends_from_and_receives_into_its_own_cuda_tensor(store, job, spawn):
    # The F on the CPU doubles the tokens; the A's tensor is torch's (its caching allocator's
    # memory, registered once by allocation), and the answer lands in the very tensor sent. The
    # routing (23 rows x top_k 2 x 8 bytes = 368) comes from the slots.
    job.update(attention_devices="cuda:0", ffn_devices="cpu:0")
    from conftest import DOUBLING_FFN

    ffn = spawn(DOUBLING_FFN.format(job=job, rank=0, store=store.address))
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        buffer = torch.zeros(job["tokens"], job["hidden"], dtype=torch.bfloat16, device="cuda")
        for step, tokens in enumerate([8, 2, 5, 8]):
            x = buffer[:tokens]
            x.copy_(torch.arange(tokens * job["hidden"], device="cuda").view(x.shape) % 32 + step)
            torch.cuda.synchronize()
            a.wait(a.push_pull(0, send=x, results_into=x))
            expected = (torch.arange(tokens * job["hidden"]).view(x.shape) % 32 + step) * 2
            assert torch.equal(x.cpu().float(), expected.float()), step
        counters = a.counters()
        assert counters["slot_bytes"] == 368 and counters["caller_buffers"] == 1, counters
        # torch's caching allocator made this memory, not the cuda plugin; the plugin exports it
        # all the same, as the whole cudaMalloc allocation (HM-R36), so the F maps it and no
        # byte goes through the ring.
        assert counters["caller_bytes"] == 1472 and counters["staged_bytes"] == 0, counters
        # A CPU tensor is not the engine's device memory: refused by name.
        with pytest.raises(hetmesh.Error, match="push_pull's send: memory of DLPack device"):
            a.push_pull(0, send=torch.zeros(2, job["hidden"], dtype=torch.bfloat16))
    code, out, err = ffn.finish()
    assert code == 0, err
