"""close() and `with` on both engines: the engine ends (its peers hear so at once), its slots and
calls are refused by name, tensors taken from its slots before keep their memory, and a second
close() does nothing."""

import gc
import threading
import time

import pytest
import torch

import hetmesh
from conftest import doubling_ffn

CLOSED = r"engine 0 was closed"


def refused(slot):
    for use in (slot.__dlpack__, slot.__dlpack_device__, lambda: slot.data_ptr,
                lambda: slot.shape, lambda: torch.from_dlpack(slot)):
        with pytest.raises(hetmesh.ClosedError, match=CLOSED):
            use()
    assert repr(slot) == "hetmesh.Slot(closed)"
    return True


def test_an_attention_engine_closed_by_its_with_block(store, job, spawn):
    ffn = doubling_ffn(spawn, store, job)
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        slot = a.result(0, 0)
        tokens = torch.from_dlpack(a.tokens(0))  # exported before the close
        tokens.fill_(3)
        a.wait(a.push_pull(0))
    code, out, err = ffn.finish()  # the block's end told the F at once: it left
    assert code == 0, err
    assert "served 1" in out
    assert a.closed and refused(slot)
    with pytest.raises(hetmesh.ClosedError, match=CLOSED):
        a.tokens(0)
    with pytest.raises(hetmesh.ClosedError, match=CLOSED):
        a.push_pull(0)
    gc.collect()
    assert torch.equal(tokens, torch.full_like(tokens, 3))  # its memory is still there
    a.close()  # twice: nothing more
    a.close()


def test_an_ffn_engine_closed_by_its_with_block(store, job, spawn):
    attention = spawn(f"""
import torch, hetmesh
with hetmesh.AttentionEngine(rank=0, store={store.address!r}, **{job!r}) as a:
    torch.from_dlpack(a.tokens(0)).fill_(2)
    a.wait(a.push_pull(0))
print("done", flush=True)
""")
    with hetmesh.FfnEngine(rank=0, store=store.address, **job) as f:
        batch = f.get_batch()
        part = batch.parts[0]
        slot, tokens_slot = part.output, part.tokens
        tokens = torch.from_dlpack(tokens_slot)  # exported before the close
        torch.from_dlpack(slot).copy_(tokens.float() * 2)
        f.respond(batch)
        assert f.get_batch() is None  # the A left
    assert f.closed and refused(slot) and refused(tokens_slot)
    with pytest.raises(hetmesh.ClosedError, match=CLOSED):
        part.tokens
    with pytest.raises(hetmesh.ClosedError, match=CLOSED):
        f.get_batch()
    with pytest.raises(hetmesh.ClosedError, match=CLOSED):
        f.respond(batch)
    assert torch.equal(tokens, torch.full_like(tokens, 2))  # its memory is still there
    f.close()
    code, out, err = attention.finish()
    assert code == 0, err


def test_close_ends_an_engine_its_slots_did_not_keep(store, job, spawn):
    ffn = doubling_ffn(spawn, store, job)
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    slot = a.tokens(0)  # a slot, not a tensor: it holds nothing past the close
    a.wait(a.push_pull(0))
    a.close()
    code, out, err = ffn.finish()  # the F heard "leave" from close(), while `a` and `slot` live
    assert code == 0, err
    assert refused(slot)


def test_close_in_another_thread_ends_a_get_batch_at_once(store, job, spawn):
    attention = spawn(f"""
import time, hetmesh
a = hetmesh.AttentionEngine(rank=0, store={store.address!r}, **{job!r})
time.sleep(600)  # never pushes
""")
    f = hetmesh.FfnEngine(rank=0, store=store.address, **job)
    ended = []

    def wait():
        try:
            f.get_batch()  # the job's 60 s, unless the close ends it
        except hetmesh.ClosedError as e:
            ended.append(e)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.5)  # inside get_batch, most likely; either way it must end with ClosedError
    started = time.monotonic()
    f.close()
    thread.join(30)
    assert ended and time.monotonic() - started < 20
    attention.kill()
