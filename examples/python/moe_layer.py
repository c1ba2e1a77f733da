"""A PyTorch attention + MoE model split across processes with hetmesh: attention instances (A)
in some processes, FFN instances (F) holding the experts in others, three micro-batches in flight.

    <build>/python/hetmesh-python examples/python/moe_layer.py              # 2A2F on cpu:0
    <build>/python/hetmesh-python examples/python/moe_layer.py --attention-device cuda:0
    <build>/python/hetmesh-python examples/python/moe_layer.py --attention-device cuda --graph
    torchrun --nproc_per_node 4 examples/python/moe_layer.py --launched  # one instance a process

(hetmesh-python is the interpreter the package was built for, with the package on its path.)

The launcher (no --role) hosts the job's store, writes the job's secret, starts every instance as
a process of its own, then computes the same model in one process and checks that each A's final
hidden states match it. Each A runs its attention and router in torch, writes the tokens (bf16)
and the routing straight into its engine's slots (DLPack, no copy) and push_pull()s them; each F
runs its share of the experts on what arrived and writes the weighted sum into the output slot,
which lands in the A's result slot; the A adds the partials of every F to its residual.

With --graph (A on a GPU), each A captures its whole decode step, every layer of every
micro-batch with its rings and waits (arm_device, enqueue_push_pull, enqueue_wait), in one CUDA
graph and replays it --steps times: no hetmesh call per layer, one graph.replay() per step. Every
replay's final hidden states must equal the first's, and those the reference. The F tells a part's
layer by its sequence number (each step pushes every layer once per micro-batch), since a graph's
pushes all carry the tag their micro-batch was armed with. --attention-device cuda gives A r the
GPU cuda:r; --graph refuses two As on one GPU, where their copies stall while their streams wait
(docs/device-triggered.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time

import hetmesh  # before torch: an interpreter without torch hears which one hetmesh is for

torch = hetmesh.import_torch()

JOB = dict(attention=2, ffn=2, micro_batches=3, layers=2, tokens=16, hidden=64, experts=4,
           top_k=2, a2f_dtype="bf16", f2a_dtype="bf16", timeout_ms=30000)
FFN_DIM = 128


# ---- the model: the same weights in every process (seeded), in float32 ----

def layer_weights(layer: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + layer)
    h, e = JOB["hidden"], JOB["experts"]
    scale = h ** -0.5
    return {
        "qkv": torch.randn(h, 3 * h, generator=g) * scale,
        "out": torch.randn(h, h, generator=g) * scale,
        "router": torch.randn(h, e, generator=g) * scale,
        "w1": torch.randn(e, h, FFN_DIM, generator=g) * scale,
        "w2": torch.randn(e, FFN_DIM, h, generator=g) * FFN_DIM ** -0.5,
    }


def model_input(rank: int, mb: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank * 100 + mb)
    return torch.randn(JOB["tokens"], JOB["hidden"], generator=g)


def attention(x: torch.Tensor, w) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Self-attention with its residual, then the router: (h, experts [T, k], weights [T, k])."""
    q, k, v = (x @ w["qkv"]).chunk(3, dim=-1)
    scores = torch.softmax(q @ k.T / q.shape[-1] ** 0.5, dim=-1)
    h = x + (scores @ v) @ w["out"]
    top = torch.topk(torch.softmax(h @ w["router"], dim=-1), JOB["top_k"], dim=-1)
    return h, top.indices.to(torch.int32), top.values / top.values.sum(-1, keepdim=True)


def experts_of(ffn_rank: int) -> range:
    share = JOB["experts"] // JOB["ffn"]
    return range(ffn_rank * share, (ffn_rank + 1) * share)


def run_experts(tokens: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, w,
                mine: range) -> torch.Tensor:
    """The weighted sum of the experts in `mine` that each token chose (zero for the others)."""
    x = tokens.float()
    out = torch.zeros_like(x)
    for e in mine:
        weight = (weights * (experts == e)).sum(-1, keepdim=True)  # [T, 1]: 0 where not chosen
        out += weight * (torch.relu(x @ w["w1"][e]) @ w["w2"][e])
    return out


def reference(rank: int) -> list[torch.Tensor]:
    """One A's final hidden states, computed in this process with the same roundings (bf16 on the
    wire both ways, the partials added in F order)."""
    weights = [layer_weights(layer) for layer in range(JOB["layers"])]
    finals = []
    for mb in range(JOB["micro_batches"]):
        x = model_input(rank, mb)
        for w in weights:
            h, experts, gates = attention(x, w)
            tokens = h.to(torch.bfloat16)
            x = h
            for f in range(JOB["ffn"]):
                x = x + run_experts(tokens, experts, gates, w, experts_of(f)).to(torch.bfloat16).float()
        finals.append(x)
    return finals


# ---- the instances ----

def run_attention(rank: int, store: str, device: str, out: str) -> None:
    a = hetmesh.AttentionEngine(rank=rank, store=store, device=device, **JOB)
    on_gpu = device.startswith("cuda")
    compute = a.create_stream() if on_gpu else None
    torch_stream = torch.cuda.ExternalStream(compute.native_handle) if on_gpu else None
    weights = [{k: v.to(device) for k, v in layer_weights(l).items()} for l in range(JOB["layers"])]
    M, F = JOB["micro_batches"], JOB["ffn"]
    x = [model_input(rank, mb).to(device) for mb in range(M)]
    tokens = [hetmesh.as_tensor(a.tokens(mb)) for mb in range(M)]
    experts = [torch.from_dlpack(a.experts(mb)) for mb in range(M)]
    gates = [torch.from_dlpack(a.weights(mb)) for mb in range(M)]
    results = [[torch.from_dlpack(a.result(mb, f)) for f in range(F)] for mb in range(M)]
    handles = [None] * M

    def finish(mb):  # wait for mb's partials and add them to its residual (in F order)
        a.wait(handles[mb])
        for f in range(F):
            x[mb] = x[mb] + results[mb][f].float()

    # On a GPU, torch computes on the engine's own stream, which push_pull waits on.
    with torch.cuda.stream(torch_stream) if on_gpu else contextlib.nullcontext():
        for layer, w in enumerate(weights):
            for mb in range(M):  # pipelined: mb's round trip flies while mb+1's attention runs
                if layer > 0:
                    finish(mb)
                h, e, g = attention(x[mb], w)
                tokens[mb].copy_(h)  # into the engine's registered memory: no copy later
                experts[mb].copy_(e)
                gates[mb].copy_(g)
                x[mb] = h
                handles[mb] = a.push_pull(mb, tag=layer, stream=compute)
        for mb in range(M):
            finish(mb)
    a.finish()
    torch.save([t.cpu() for t in x], os.path.join(out, f"attention{rank}.pt"))


def run_attention_graph(rank: int, store: str, device: str, out: str, steps: int) -> None:
    """The decode step captured in one CUDA graph with its rings and waits, replayed `steps`
    times."""
    a = hetmesh.AttentionEngine(rank=rank, store=store, device=device, **JOB)
    s = torch.cuda.Stream()
    weights = [{k: v.to(device) for k, v in layer_weights(l).items()} for l in range(JOB["layers"])]
    M, F = JOB["micro_batches"], JOB["ffn"]
    x0 = [model_input(rank, mb).to(device) for mb in range(M)]
    final = [torch.empty_like(x) for x in x0]  # the step's output, at a fixed address
    tokens = [hetmesh.as_tensor(a.tokens(mb)) for mb in range(M)]
    experts = [torch.from_dlpack(a.experts(mb)) for mb in range(M)]
    gates = [torch.from_dlpack(a.weights(mb)) for mb in range(M)]
    results = [[torch.from_dlpack(a.result(mb, f)) for f in range(F)] for mb in range(M)]
    for mb in range(M):
        a.arm_device(mb)  # each ring sends mb from its slots

    def step():
        x = [x0[mb].clone() for mb in range(M)]

        def finish(mb):  # the stream waits for mb's partials, then adds them (in F order)
            a.enqueue_wait(mb, s)
            for f in range(F):
                x[mb] = x[mb] + results[mb][f].float()

        for layer, w in enumerate(weights):
            for mb in range(M):
                if layer > 0:
                    finish(mb)
                h, e, g = attention(x[mb], w)
                tokens[mb].copy_(h)
                experts[mb].copy_(e)
                gates[mb].copy_(g)
                x[mb] = h
                a.enqueue_push_pull(mb, JOB["tokens"], s)
        for mb in range(M):
            finish(mb)
            final[mb].copy_(x[mb])

    def check_trips():
        trips = a.device_trips()
        if trips.failures:
            raise RuntimeError(f"attention {rank}: {trips.failed} round trip(s) failed: "
                               f"{trips.failures[0]}")

    with torch.cuda.stream(s):
        step()  # once eagerly: it warms up, and hetmesh borrows the stream before the capture
    s.synchronize()
    check_trips()
    eager = [t.clone() for t in final]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s, capture_error_mode="thread_local"):
        step()
    for replay in range(steps):
        for t in final:
            t.zero_()
        graph.replay()  # the whole step: no hetmesh call per layer
        torch.cuda.synchronize()
        check_trips()
        for mb in range(M):
            if not torch.equal(final[mb], eager[mb]):
                raise RuntimeError(f"attention {rank}: replay {replay} micro-batch {mb} differs "
                                   f"from the step run eagerly")
    print(f"attention {rank}: {steps} replays of the captured step, each equal to the eager one",
          flush=True)
    a.finish()
    torch.save([t.cpu() for t in final], os.path.join(out, f"attention{rank}.pt"))


def run_ffn(rank: int, store: str, device: str) -> None:
    f = hetmesh.FfnEngine(rank=rank, store=store, device=device, **JOB)
    weights = [layer_weights(layer) for layer in range(JOB["layers"])]
    mine = experts_of(rank)
    for batch in f.batches():
        for part in batch.parts:  # each step pushes every layer once per micro-batch, in order
            layer = (part.sequence - 1) % JOB["layers"]
            out = run_experts(torch.from_dlpack(part.tokens), torch.from_dlpack(part.experts),
                              torch.from_dlpack(part.weights), weights[layer], mine)
            torch.from_dlpack(part.output).copy_(out)
        f.respond(batch)


def compare(rank: int, path: str) -> float | None:
    """The largest difference of attention `rank`'s final hidden states (saved at `path`) from the
    single-process reference; None, said, where one is beyond the tolerance."""
    worst = 0.0
    for mb, (got, want) in enumerate(zip(torch.load(path), reference(rank))):
        worst = max(worst, (got - want).abs().max().item())
        if not torch.allclose(got, want, rtol=1e-2, atol=1e-2):
            print(f"moe_layer: attention {rank} micro-batch {mb} differs from the "
                  f"single-process reference by {(got - want).abs().max().item():.3g}",
                  file=sys.stderr)
            return None
    return worst


def run_launched(place: hetmesh.Launched, args) -> int:
    """This process as the instance its launcher (torchrun, mpirun, srun) makes it: process 0
    hosts the store at the launcher's master address; each A checks its own result."""
    if not place.store:
        print(f"moe_layer: {place.launcher} gives no store address: set MASTER_ADDR and "
              f"MASTER_PORT", file=sys.stderr)
        return 1
    secret = os.environ.get("HETMESH_JOB_SECRET_FILE") or None
    server = hetmesh.StoreServer(place.store, secret) if place.hosts_store else None
    torch.set_num_threads(1)
    code = 1
    try:
        with tempfile.TemporaryDirectory(prefix="hetmesh-moe-") as folder:
            if place.role == "attention":
                run_attention(place.rank, place.store, attention_device(args, place.rank), folder)
                result = os.path.join(folder, f"attention{place.rank}.pt")
                difference = compare(place.rank, result)
                if difference is not None:
                    code = 0
                    print(f"verified: attention {place.rank} of {JOB['attention']} x "
                          f"{JOB['ffn']} ffn ({place.launcher} process {place.process}): its "
                          f"final hidden states match the single-process reference (max "
                          f"difference {difference:.3g})", flush=True)
            else:
                run_ffn(place.rank, place.store, args.ffn_device)
                code = 0
    finally:
        # Process 0's store stays until every other process is done with it (or failed), at
        # most the job's timeout.
        store = hetmesh._native.StoreClient(place.store, secret, JOB["timeout_ms"])
        if server is None:
            store.add("moe_layer/done", 1)
        else:
            others = JOB["attention"] + JOB["ffn"] - 1
            deadline = time.monotonic() + JOB["timeout_ms"] / 1000
            while store.add("moe_layer/done", 0) < others and time.monotonic() < deadline:
                time.sleep(0.001)
            server.close()
    return code


def attention_device(args, rank: int) -> str:
    """A `rank`'s device: --attention-device, where "cuda" is a GPU per A (cuda:rank)."""
    return f"cuda:{rank}" if args.attention_device == "cuda" else args.attention_device


def launch(args) -> int:
    with tempfile.TemporaryDirectory(prefix="hetmesh-moe-") as folder:
        secret = os.path.join(folder, "job.secret")
        hetmesh.write_secret(secret)
        store = hetmesh.StoreServer(secret_file=secret)
        env = {**os.environ, "HETMESH_JOB_SECRET_FILE": secret}
        me = [sys.executable, os.path.abspath(__file__), "--store", store.address, "--out", folder]
        procs = [subprocess.Popen(me + ["--role", "ffn", "--rank", str(f), "--device",
                                        args.ffn_device], env=env) for f in range(JOB["ffn"])]
        graph = ["--graph", "--steps", str(args.steps)] if args.graph else []
        procs += [subprocess.Popen(me + ["--role", "attention", "--rank", str(r), "--device",
                                         attention_device(args, r)] + graph, env=env)
                  for r in range(JOB["attention"])]
        codes = [p.wait(timeout=300) for p in procs]
        if any(codes):
            print(f"moe_layer: an instance failed (exit codes {codes})", file=sys.stderr)
            return 1
        worst = 0.0
        for rank in range(JOB["attention"]):
            difference = compare(rank, os.path.join(folder, f"attention{rank}.pt"))
            if difference is None:
                return 1
            worst = max(worst, difference)
        print(f"verified: {JOB['attention']} attention x {JOB['ffn']} ffn, "
              f"{JOB['micro_batches']} micro-batches, {JOB['layers']} layers, A on "
              f"{args.attention_device}{' (the step captured in a CUDA graph)' if args.graph else ''}"
              f", F on {args.ffn_device}: every final hidden state matches "
              f"the single-process reference (max difference {worst:.3g})")
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attention-device", default="cpu:0",
                        help="every A's device; cuda: a GPU per A (cuda:0, cuda:1, ...)")
    parser.add_argument("--ffn-device", default="cpu:0")
    parser.add_argument("--graph", action="store_true",
                        help="capture each A's decode step in a CUDA graph and replay it")
    parser.add_argument("--steps", type=int, default=20, help="replays of the graph")
    parser.add_argument("--launched", action="store_true",
                        help="be one instance of a job a launcher (torchrun, mpirun, srun) started, "
                             "the place taken from its variables")
    parser.add_argument("--role", choices=["attention", "ffn"], help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu:0", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.launched:  # started by torchrun, mpirun or srun: one instance a process
        place = hetmesh.launched(**JOB)
        if place is None:
            parser.error("--launched: no launcher's variables (RANK, OMPI_COMM_WORLD_RANK, "
                         "SLURM_PROCID, ...) are set")
        return run_launched(place, args)
    if args.role is None:
        if args.graph and not args.attention_device.startswith("cuda"):
            parser.error("--graph captures a CUDA graph: it needs --attention-device cuda or cuda:N")
        if args.graph and JOB["attention"] > 1 and args.attention_device != "cuda":
            parser.error(f"--graph with every A on {args.attention_device}: two A processes whose "
                         f"streams wait on one GPU stall (docs/device-triggered.md); give each its "
                         f"own with --attention-device cuda")
        return launch(args)
    torch.set_num_threads(1)
    if args.role == "attention" and args.graph:
        run_attention_graph(args.rank, args.store, args.device, args.out, args.steps)
    elif args.role == "attention":
        run_attention(args.rank, args.store, args.device, args.out)
    else:
        run_ffn(args.rank, args.store, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
