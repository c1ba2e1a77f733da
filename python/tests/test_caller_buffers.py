"""The application's own tensors in place of the engine's slots: an A sends from and receives into
its tensors, an F responds from its own, each allocation registered once (row slices of varying
length find it), and a tensor the job cannot use is refused by name."""

import sys

import pytest
import torch

import hetmesh

# An F that answers tokens * 2 + 1 from a tensor of its own, checks the routing the A sent from
# its tensor, and prints its counters.
OWN_OUTPUT_FFN = """
import torch, hetmesh
job = {job!r}
out = torch.zeros(job["tokens"], job["hidden"], dtype=torch.bfloat16)
with hetmesh.FfnEngine(rank=0, store={store!r}, **job) as f:
    for batch in f.batches():
        outputs = []
        for part in batch.parts:
            experts = torch.from_dlpack(part.experts)
            weights = torch.from_dlpack(part.weights)
            assert experts.tolist() == [[row, row + 1] for row in range(part.count)], experts
            assert weights.tolist() == [[0.25, 0.75]] * part.count, weights
            rows = out[:part.count]
            rows[:] = torch.from_dlpack(part.tokens).float() * 2 + 1
            outputs.append(rows)
        # One part: its tensor alone (the connector's tests give lists).
        f.respond(batch, outputs=outputs[0] if len(outputs) == 1 else outputs)
    print("counters", f.counters(), flush=True)
"""


def test_an_a_and_an_f_use_their_own_tensors_in_place(store, job, spawn):
    ffn = spawn(OWN_OUTPUT_FFN.format(job=job, store=store.address))
    hidden, top_k = job["hidden"], job["top_k"]
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        hidden_states = torch.zeros(job["tokens"], hidden, dtype=torch.bfloat16)
        routing = torch.zeros(job["tokens"], top_k, 2, dtype=torch.int32)
        routing[:, :, 0] = torch.arange(job["tokens"]).unsqueeze(1) + torch.arange(top_k)
        routing[:, :, 1] = torch.tensor([0.25, 0.75]).view(torch.int32)
        slot = torch.from_dlpack(a.result(0, 0))
        slot.fill_(-7)
        for step, tokens in enumerate([8, 3, 5, 1, 8]):
            x = hidden_states[:tokens]
            x.copy_(torch.arange(tokens * hidden).view(tokens, hidden) % 13 + step)
            # The answer lands in the very tensor that was sent (vLLM's ref_tensor).
            a.wait(a.push_pull(step % 2, send=x, routing=routing[:tokens], results_into=x,
                               tag=step))
            expected = (torch.arange(tokens * hidden).view(tokens, hidden) % 13 + step) * 2 + 1
            assert torch.equal(x.float(), expected.float()), step
            if step == 0:
                registered = a.counters()["caller_buffers"]
        assert slot.unique().tolist() == [-7.0], "the result slot was written"
        counters = a.counters()
        assert counters["slot_bytes"] == 0, counters
        # hidden_states and routing, registered at the first step (one registration where they
        # share pages), and found by every row slice after it.
        assert registered in (1, 2) and counters["caller_buffers"] == registered, counters
        rows = 8 + 3 + 5 + 1 + 8
        assert counters["caller_bytes"] == rows * (hidden * 2 + top_k * 8) + rows * hidden * 2
        assert counters["staged_bytes"] == 0, counters
        # The same counts as Prometheus reads them (docs/metrics.md); not served: no address.
        samples = dict(line.rsplit(" ", 1) for line in a.metrics().splitlines()
                       if not line.startswith("#"))
        moved = [v for k, v in samples.items()
                 if k.startswith("hetmesh_moved_bytes_total{") and 'memory="application"' in k]
        assert moved == [str(counters["caller_bytes"])], samples
        trips = [v for k, v in samples.items() if k.startswith("hetmesh_round_trip_seconds_count")]
        assert trips == ["5"], samples
        assert a.metrics_address == ""
    code, out, err = ffn.finish()
    assert code == 0, err
    assert "'caller_buffers': 1" in out, out


def test_a_tensor_the_job_cannot_use_is_refused_by_name(store, job, spawn):
    from conftest import doubling_ffn

    ffn = doubling_ffn(spawn, store, job)
    hidden = job["hidden"]
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        cases = [
            (dict(send=torch.zeros(4, hidden, dtype=torch.float16)),
             "push_pull's send: elements of DLPack type (code 2, 16 bits), where the job's are "
             "bfloat16"),
            (dict(send=torch.zeros(4, hidden + 1, dtype=torch.bfloat16)),
             f"push_pull's send: rows of {(hidden + 1) * 2} bytes, where the job's are "
             f"{hidden * 2} bytes"),
            (dict(send=torch.zeros(hidden, 4, dtype=torch.bfloat16).t()),
             "push_pull's send: not contiguous in C order"),
            (dict(send=torch.zeros(2, hidden, dtype=torch.bfloat16), tokens=4),
             "push_pull: a tensor of 2 rows for 4 rows of tokens"),
            (dict(results_into=[1, 2]),
             "push_pull's results_into: a value of type int has no __dlpack__"),
            (dict(results_into=[torch.zeros(8, hidden, dtype=torch.bfloat16)] * 2),
             "push_pull: 2 result buffers for 1 ffn instance(s)"),
        ]
        for kwargs, message in cases:
            with pytest.raises(hetmesh.Error) as refused:
                a.push_pull(0, **kwargs)
            assert message in str(refused.value), (kwargs, str(refused.value))
        # Nothing was sent: the slot path still works.
        torch.from_dlpack(a.tokens(0)).fill_(1)
        a.wait(a.push_pull(0))
        assert torch.from_dlpack(a.result(0, 0)).float().unique().tolist() == [2.0]
    code, out, err = ffn.finish()
    assert code == 0, err


def test_topology_groups_is_a_keyword_and_refused_where_the_as_do_not_divide():
    config = hetmesh.config(attention=4, ffn=2, topology="groups")
    assert 'topology = "groups"' in config.to_toml()
    with pytest.raises(hetmesh.Error, match="3 As do not divide among 2 Fs"):
        hetmesh.config(attention=3, ffn=2, topology="groups")


# An F that answers each part's result_rows rows: row r of the answer is r + the part's count.
RESULT_ROWS_FFN = """
import torch, hetmesh
job = {job!r}
with hetmesh.FfnEngine(rank=0, store={store!r}, **job) as f:
    for batch in f.batches():
        outputs = []
        for part in batch.parts:
            out = torch.from_dlpack(part.output)
            assert out.shape[0] == part.result_rows, (out.shape, part.result_rows)
            out[:] = (torch.arange(part.result_rows) + part.count).unsqueeze(1)
            print("part", part.count, part.result_rows, flush=True)
        f.respond(batch)
"""


def test_an_answer_has_the_rows_the_push_asked_for_not_the_tokens_sent(store, job, spawn):
    ffn = spawn(RESULT_ROWS_FFN.format(job=job, store=store.address))
    hidden = job["hidden"]
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        x = torch.ones(job["tokens"], hidden, dtype=torch.bfloat16)
        into = torch.full((job["tokens"], hidden), -1.0, dtype=torch.bfloat16)
        for tokens, rows in [(8, 2), (1, 8), (5, 0), (3, 3)]:
            into.fill_(-1)
            a.wait(a.push_pull(0, send=x[:tokens], results_into=into, result_rows=rows))
            expected = (torch.arange(rows) + tokens).unsqueeze(1).expand(rows, hidden)
            assert torch.equal(into[:rows].float(), expected.float()), (tokens, rows)
            assert into[rows:].unique().tolist() in ([-1.0], []), "rows past the answer written"
        # Bounds, by name: more rows than a slot holds, a buffer too short for the answer.
        with pytest.raises(hetmesh.InvalidArgumentError, match="an answer of 9 rows"):
            a.push_pull(0, send=x[:1], result_rows=job["tokens"] + 1)
        with pytest.raises(hetmesh.InvalidArgumentError,
                           match="results_into of 2 rows for an answer of 4 rows"):
            a.push_pull(0, send=x[:1], results_into=into[:2], result_rows=4)
    code, out, err = ffn.finish()
    assert code == 0, err
    assert "part 8 2" in out and "part 1 8" in out and "part 5 0" in out, out


def test_tensors_from_many_allocations_each_land_and_register_once(store, job, spawn):
    # More allocations than the binding remembers as registered (8), each sent and answered in
    # place twice, in turn: every answer right; each tensor first seen of its allocation is kept
    # by the engine (one reference more, so its memory outlives the registration), and the second
    # pass registers and keeps nothing new.
    ffn = spawn(OWN_OUTPUT_FFN.format(job=job, store=store.address))
    hidden, top_k, tokens = job["hidden"], job["top_k"], 3
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        routing = torch.zeros(tokens, top_k, 2, dtype=torch.int32)
        routing[:, :, 0] = torch.arange(tokens).unsqueeze(1) + torch.arange(top_k)
        routing[:, :, 1] = torch.tensor([0.25, 0.75]).view(torch.int32)
        a.register_buffer(routing)
        # Each at the start of an allocation of its own of 80 KB, so that no two share a page.
        tensors = [torch.zeros(40960, dtype=torch.bfloat16)[:tokens * hidden].view(tokens, hidden)
                   for _ in range(12)]
        for rounds in range(2):
            kept = []  # references the engine took to each tensor during its round trip
            for i, x in enumerate(tensors):
                sent = torch.full((tokens, hidden), float(i + rounds), dtype=torch.bfloat16)
                x.copy_(sent)
                before = sys.getrefcount(x)
                a.wait(a.push_pull(0, send=x, routing=routing, results_into=x))
                kept.append(sys.getrefcount(x) - before)
                assert torch.equal(x, sent * 2 + 1), (rounds, i)
            assert kept == [1 - rounds] * 12, (rounds, kept)
            if rounds == 0:
                registered = a.counters()["caller_buffers"]
        assert registered == 13 and a.counters()["caller_buffers"] == registered, a.counters()
    code, _, err = ffn.finish()
    assert code == 0, err
