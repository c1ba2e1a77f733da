"""What a push carries and where it lands, from Python: extra A2F tensors declared by keyword
(a2f_tensors), no routing (top_k = 0), a tensor left out of a push, As that push at agreed row
offsets so that an F sees one packed batch, and an F that receives a micro-batch into a tensor of
its own."""

import pytest
import torch

import hetmesh

# 2 As, 1 F; router logits of 3 float32 columns a token beside the tokens; no routing. Whole
# batches only, however far apart a loaded machine runs the As (the gather window is the bound).
JOB = dict(attention=2, ffn=1, micro_batches=2, tokens=8, hidden=16, experts=1, top_k=0,
           a2f_tensors={"router_logits": ("float32", 3)}, transport="ipc", timeout_ms=60000,
           gather_window_ms=60000)
COUNTS = [(8, 3), (1, 5), (0, 2), (8, 8)]  # each A's tokens per step


def logits_of(x):
    return x[:, :3].float() * 10


# The F: every batch packed, its tokens and logits one tensor each, answering tokens + 1 over the
# whole batch; micro-batch 1 lands in a tensor of the F's own.
PACKED_FFN = """
import torch, hetmesh
job = {job!r}
own = torch.zeros(job["attention"] * job["tokens"], job["hidden"], dtype=torch.bfloat16)
with hetmesh.FfnEngine(rank=0, store={store!r}, **job) as f:
    f.receive_into(1, "tokens", own)
    packed = landed = logits_right = batches = 0
    for batch in f.batches():
        batches += 1
        packed += batch.packed and batch.count == sum(p.count for p in batch.parts)
        tokens = hetmesh.as_tensor(batch.tokens)
        landed += tokens.data_ptr() == own.data_ptr()
        if batch.parts[0].rows("router_logits"):
            logits = hetmesh.as_tensor(batch.tensor("router_logits"))
            logits_right += torch.equal(logits, tokens[:, :3].float() * 10)
        hetmesh.as_tensor(batch.output).copy_(tokens.float() + 1)
        f.respond(batch)
    print("batches", batches, "packed", packed, "landed", landed, "logits", logits_right,
          flush=True)
"""


def run_attention(a, rank):
    for step, counts in enumerate(COUNTS):
        n, mb = counts[rank], step % 2
        x = torch.arange(n * 16).view(n, 16).to(torch.bfloat16) + rank * 100 + step
        hetmesh.as_tensor(a.tensor(mb, "tokens"))[:n].copy_(x)
        # Odd steps are MoE layers: their router logits travel, from a tensor of the A's own.
        logits = {"router_logits": logits_of(x)} if step % 2 else {}
        handle = a.push_pull(mb, n, tensors=logits, rows={} if logits else {"router_logits": 0},
                             row_offset=sum(counts[:rank]))
        a.wait(handle)
        answer = hetmesh.as_tensor(a.result(mb, 0))[:n]
        assert torch.equal(answer.float(), x.float() + 1), (step, rank)


def test_as_that_agree_on_offsets_land_as_one_batch_with_their_tensors(store, spawn):
    ffn = spawn(PACKED_FFN.format(job=JOB, store=store.address))
    import threading

    errors = []

    def attention(rank):
        try:
            with hetmesh.AttentionEngine(rank=rank, store=store.address, **JOB) as a:
                run_attention(a, rank)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=attention, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    code, out, err = ffn.finish()
    assert code == 0, err
    # Micro-batch 1 (steps 1 and 3) lands in the F's own tensor: the F said so before it answered
    # step 0, which each A waited for before it pushed step 1.
    assert "batches 4 packed 4 landed 2 logits 2" in out, out


def test_pushes_that_do_not_fit_are_refused_by_name(store, spawn):
    ffn = spawn(PACKED_FFN.format(job={**JOB, "attention": 1}, store=store.address))
    job = {**JOB, "attention": 1}
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        assert a.config.a2f_tensors == [("router_logits", "fp32", 3)]
        assert tuple(hetmesh.as_tensor(a.tensor(0, "router_logits")).shape) == (8, 3)
        with pytest.raises(hetmesh.InvalidArgumentError, match="no A2F tensor 'router_logit'"
                           ".*did you mean router_logits"):
            a.tensor(0, "router_logit")
        with pytest.raises(hetmesh.InvalidArgumentError, match="without routing"):
            a.push_pull(0, 2, routing=torch.zeros(2, 0, 2, dtype=torch.int32))
        with pytest.raises(hetmesh.InvalidArgumentError, match="rows 4..10 at row_offset 4"):
            a.push_pull(0, 6, row_offset=4)
        with pytest.raises(hetmesh.InvalidArgumentError, match="a tensor of 2 rows for 4 rows of "
                           "router_logits"):
            a.push_pull(0, 4, tensors={"router_logits": torch.zeros(2, 3)})
        with pytest.raises(hetmesh.InvalidArgumentError, match="where the job.s are float32"):
            a.push_pull(0, 2, tensors={"router_logits": torch.zeros(2, 3, dtype=torch.bfloat16)})
        with pytest.raises(hetmesh.InvalidArgumentError, match="give it as send="):
            a.push_pull(0, 2, tensors={"tokens": torch.zeros(2, 16, dtype=torch.bfloat16)})
        run_attention_alone(a)
    code, out, err = ffn.finish()
    assert code == 0, err


def run_attention_alone(a):
    x = torch.ones(3, 16, dtype=torch.bfloat16)
    a.wait(a.push_pull(0, send=x, results_into=x))
    assert torch.equal(x.float(), torch.full((3, 16), 2.0))


def test_keyword_tensors_are_checked_by_the_config_reader():
    with pytest.raises(hetmesh.InvalidArgumentError, match="not a tensor name"):
        hetmesh.config(a2f_tensors={"routing": ("float32", 2)})
    with pytest.raises(hetmesh.InvalidArgumentError, match="unknown value \"float64\""):
        hetmesh.config(a2f_tensors={"logits": ("float64", 2)})
    with pytest.raises(TypeError, match="expected \\(dtype, columns\\)"):
        hetmesh.config(a2f_tensors={"logits": "float32"})
    c = hetmesh.config(top_k=0, a2f_tensors={"topk_ids": ("int64", 8), "scales": {
        "dtype": "fp32", "columns": 1}})
    assert c.top_k == 0 and c.a2f_tensors == [("scales", "fp32", 1), ("topk_ids", "int64", 8)]


def test_an_explicit_map_from_keywords():
    c = hetmesh.config(attention=3, ffn=2, experts=2, topology="map", ffns_of=[[0], [0, 1], [1]])
    assert c.topology == "map"
    with pytest.raises(hetmesh.InvalidArgumentError, match="ffn 1 serves no A"):
        hetmesh.config(attention=2, ffn=2, experts=2, topology="map", ffns_of=[[0], [0]])
