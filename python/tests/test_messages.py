"""Side-band messages beside the slots (a framework's per-step metadata) and pushes that queue:
an A pushes a stage's next round trips before the answers are in."""

import json

import torch

import hetmesh

# An F that reads the A's message for each step before the step's part (it was sent first, so it
# is there already), answers with a message of its own, then doubles the tokens.
MESSAGE_FFN = """
import json, torch, hetmesh
job = {job!r}
with hetmesh.FfnEngine(rank=0, store={store!r}, **job) as f:
    for batch in f.batches():
        part = batch.parts[0]
        message = f.receive_message(timeout_ms=0)
        assert message is not None, "the part overtook its message"
        role, rank, data = message
        assert (role, rank) == ("attention", part.rank), message
        step = json.loads(data)
        assert step["layer"] == part.tag, (step, part.tag)
        f.send_message(part.rank, json.dumps({{"tokens_seen": step["tokens"]}}).encode())
        out = torch.from_dlpack(part.output)
        out[:] = torch.from_dlpack(part.tokens).float() * 2
        f.respond(batch)
print("served", flush=True)
"""


def test_a_message_arrives_before_the_data_sent_after_it_both_ways(store, job, spawn):
    ffn = spawn(MESSAGE_FFN.format(job=job, store=store.address))
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        for layer in range(3):
            tokens = job["tokens"] - layer
            a.send_message(0, json.dumps({"layer": layer, "tokens": tokens}).encode())
            torch.from_dlpack(a.tokens(0))[:tokens].fill_(layer + 1)
            a.wait(a.push_pull(0, tokens, tag=layer))
            # The F's answer came after its message: the message is here already.
            role, rank, data = a.receive_message(timeout_ms=0)
            assert (role, rank) == ("ffn", 0)
            assert json.loads(data) == {"tokens_seen": tokens}
            assert torch.from_dlpack(a.result(0, 0))[:tokens].float().unique().tolist() == [
                2.0 * (layer + 1)]
        assert a.receive_message(timeout_ms=0) is None
    code, out, err = ffn.finish()
    assert code == 0, err
    assert "served" in out


def test_pushes_queue_without_a_wait_between_them(store, job, spawn):
    job["queue_depth"] = 4
    from conftest import doubling_ffn

    ffn = doubling_ffn(spawn, store, job)
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        torch.from_dlpack(a.tokens(0)).fill_(1.5)
        handles = [a.push_pull(0, tag=layer) for layer in range(4)]  # no wait in between
        trips = [a.wait(handle) for handle in handles]
        assert [trip.sequence for trip in trips] == [1, 2, 3, 4]
        assert torch.from_dlpack(a.result(0, 0)).float().unique().tolist() == [3.0]
    code, out, err = ffn.finish()
    assert code == 0, err
    assert "served 4" in out


def test_an_idle_rank_pushes_no_tokens(store, job, spawn):
    from conftest import doubling_ffn

    ffn = doubling_ffn(spawn, store, job)
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        trip = a.wait(a.push_pull(0, 0))
        assert trip.sequence == 1
    code, out, err = ffn.finish()
    assert code == 0, err
