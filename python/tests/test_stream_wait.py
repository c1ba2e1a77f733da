"""A device stream waits for a round trip's results without the host (stream_wait on the engine's
arrival flag), and is let go when the engine ends with the round trip outstanding."""

import pytest
import torch

import hetmesh
from conftest import DOUBLING_FFN

# The doubling FFN, answering each batch only after `delay` seconds.
SLOW_FFN = DOUBLING_FFN.replace("    f.respond(batch)", "    time.sleep({delay})\n    f.respond(batch)"
                                ).replace("import sys,", "import sys, time,")


def slow_ffn(spawn, store, job, delay):
    return spawn(SLOW_FFN.format(job=job, rank=0, store=store.address, delay=delay))


def test_a_stream_passes_its_wait_only_with_the_results_in(store, job, spawn):
    ffn = slow_ffn(spawn, store, job, delay=0.3)
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        tokens = torch.from_dlpack(a.tokens(0))
        tokens.fill_(3)
        torch.from_dlpack(a.experts(0)).fill_(0)
        result = torch.from_dlpack(a.result(0, 0))
        result.zero_()
        s = a.create_stream()
        h = a.push_pull(0)
        a.stream_wait(h, s)
        s.synchronize()  # returns once the stream got past its wait
        # The results are there before the host's wait() was ever called.
        assert torch.equal(result, (tokens.float() * 2).to(torch.bfloat16))
        a.wait(h)
    assert ffn.finish()[0] == 0


def test_a_stream_still_waiting_when_the_engine_finishes_is_let_go(store, job, spawn):
    slow_ffn(spawn, store, job, delay=30)  # never answers in time
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    s = a.create_stream()
    a.stream_wait(a.push_pull(0), s)
    a.finish()
    s.synchronize(timeout_ms=10000)  # a stream left waiting would raise TimeoutError here


def test_stream_wait_needs_a_stream_of_the_engine(store, job, spawn):
    slow_ffn(spawn, store, job, delay=0)
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        h = a.push_pull(0)
        with pytest.raises(hetmesh.InvalidArgumentError, match="name the stream"):
            a.stream_wait(h, None)
        with pytest.raises(hetmesh.InvalidArgumentError, match="handle"):
            a.stream_wait(h ^ 0x7f, a.create_stream())
        a.wait(h)
