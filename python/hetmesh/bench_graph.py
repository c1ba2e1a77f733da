"""A decode step's round trips triggered by the device, eager and captured in a CUDA graph,
against the host's push_pull per layer, in alternating phases of one job (docs/device-triggered.md).

    python3 -m hetmesh.bench_graph --attention-device cuda:0            # 8 layers, StepMesh's shape
    python3 -m hetmesh.bench_graph --attention-device cpu:0 --iterations 20

A step sends `--layers` round trips of one micro-batch, each layer's tokens the previous layer's
answer (a copy on the stream, as the next layer's attention would write them); the F answers each
part's first row + 1 (only that row: the benchmark measures the exchange, not the F's arithmetic),
so every step's last answer is checked against its first tokens + layers. Three modes, each a
step at a time, then one synchronize:

- host: push_pull(stream=s) and stream_wait on the stream per layer, then wait() for each (the
  host makes two engine calls per layer and a wait per layer);
- device: the ring and the wait enqueued on the stream per layer (enqueue_push_pull,
  enqueue_wait), issued eagerly;
- graph: the same step captured once in a CUDA graph (torch.cuda.graph) and replayed (cuda only).

Reported: the step's wall time per layer, and the host's time per step before its synchronize.

With --interference N (cuda): whether the exchange takes compute from the GPU's kernels. A
window of N x N bf16 matmuls on a stream of their own (~200 ms of them) is timed by CUDA events
alone and while the captured step is replayed over and over on its stream (each replay
synchronized), in alternating phases; the matmuls' slowdown is the second over the first.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import hetmesh
from hetmesh.bench import (add_common_arguments, add_phase_arguments, ffn_processes, percentile,
                           run_info, write_json)
from hetmesh.bench_queue import serve

# StepMesh's per-A traffic, bf16 both ways (an answer is the next layer's tokens), no routing;
# micro-batch 0 for the host's pushes, 1 armed for the device.
DEFAULT_JOB = dict(attention=1, ffn=1, micro_batches=2, queue_depth=8, tokens=128, hidden=7168,
                   experts=1, top_k=0, a2f_dtype="bf16", f2a_dtype="bf16", timeout_ms=30000)
HOST_MB, DEVICE_MB = 0, 1


def measure(args, job: dict) -> dict:
    torch = hetmesh.import_torch()
    cuda = args.attention_device.startswith("cuda")
    layers = args.layers
    with ffn_processes("hetmesh.bench_graph", job, args) as (store, secret):
        with hetmesh.AttentionEngine(rank=0, store=store, secret_file=secret,
                                     device=args.attention_device, **job) as a:
            tokens = [hetmesh.as_tensor(a.tokens(mb)) for mb in (HOST_MB, DEVICE_MB)]
            result = [hetmesh.as_tensor(a.result(mb, 0)) for mb in (HOST_MB, DEVICE_MB)]
            first = torch.full((1, job["hidden"]), 3.0, dtype=torch.bfloat16,
                               device=tokens[0].device)
            # On a GPU each layer's tokens are the answer before (a copy in stream order); the
            # cpu plugin's streams run no torch work, so there every layer sends `first` again.
            chain = cuda and not args.no_chain
            expected = first.float().add(layers if chain else 1).to(torch.bfloat16)
            s = torch.cuda.Stream() if cuda else a.create_stream()
            count = job["tokens"]
            a.arm_device(DEVICE_MB)

            def layer_copies(mb: int, layer: int) -> None:
                # The next layer's tokens are this layer's answer.
                if chain and layer + 1 < layers:
                    tokens[mb][:1].copy_(result[mb][:1])

            def host_step() -> None:
                t, handles = tokens[HOST_MB], []
                t[:1].copy_(first)
                for layer in range(layers):
                    handles.append(a.push_pull(HOST_MB, count, stream=s))
                    a.stream_wait(handles[-1], s)
                    layer_copies(HOST_MB, layer)
                for h in handles:
                    a.wait(h)

            def device_step() -> None:
                tokens[DEVICE_MB][:1].copy_(first)
                for layer in range(layers):
                    a.enqueue_push_pull(DEVICE_MB, count, s)
                    a.enqueue_wait(DEVICE_MB, s)
                    layer_copies(DEVICE_MB, layer)

            graph = None
            if cuda:
                with torch.cuda.stream(s):
                    device_step()  # borrows the stream and warms up before the capture
                s.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=s, capture_error_mode="thread_local"):
                    device_step()

            def graph_step() -> None:
                graph.replay()

            modes = {"host": host_step, "device": device_step}
            if graph is not None:
                modes["graph"] = graph_step
            clock = time.perf_counter_ns
            wall = {m: [] for m in modes}
            host = {m: [] for m in modes}
            wrong = {m: 0 for m in modes}

            def run(mode: str, keep: bool) -> None:
                answer = result[HOST_MB if mode == "host" else DEVICE_MB][:1]
                if cuda:
                    with torch.cuda.stream(s):
                        answer.zero_()
                    s.synchronize()
                else:
                    answer.zero_()
                start = clock()
                if cuda:
                    with torch.cuda.stream(s):
                        modes[mode]()
                else:
                    modes[mode]()
                issued = clock()
                s.synchronize()
                done = clock()
                if keep:
                    wall[mode].append((done - start) / layers / 1000)
                    host[mode].append((issued - start) / 1000)
                    wrong[mode] += not torch.equal(answer, expected)

            for mode in modes:
                for _ in range(args.warmup):
                    run(mode, keep=False)
            for _ in range(args.phases):
                for mode in modes:
                    for _ in range(args.iterations):
                        run(mode, keep=True)
            interference = None
            if graph is not None and args.interference:
                def exchange() -> None:
                    with torch.cuda.stream(s):
                        graph.replay()
                    s.synchronize()
                interference = matmul_interference(torch, args.interference, exchange,
                                                   args.phases)
            trips = a.device_trips()
            a.finish()
    summary = {m: {"per_layer_us": {"p50": percentile(wall[m], 0.5),
                                    "p99": percentile(wall[m], 0.99)},
                   "host_per_step_us": {"p50": percentile(host[m], 0.5),
                                        "p99": percentile(host[m], 0.99)},
                   "wrong_answers": wrong[m]} for m in modes}
    base = summary["host"]["per_layer_us"]["p50"]
    for m in modes:
        summary[m]["over_host"] = summary[m]["per_layer_us"]["p50"] / base
    return {"run": run_info(), "job": job, "attention_device": args.attention_device,
            "ffn_device": args.ffn_device, "layers": layers, "modes": summary,
            **({"interference": interference} if interference else {}),
            "device_trips": {"rung": trips.rung, "completed": trips.completed,
                             "failed": trips.failed, "failures": trips.failures}}


def matmul_interference(torch, n: int, exchange, phases: int) -> dict:
    """A window of n x n matmuls on a stream of their own, timed alone and while `exchange` (one
    synchronized step) runs over and over: how much the exchange slows the GPU's kernels."""
    side = torch.cuda.Stream()
    x, y = (torch.randn(n, n, dtype=torch.bfloat16, device="cuda:0") for _ in range(2))
    out = torch.empty_like(x)

    def window(count: int, busy: bool) -> tuple:
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        with torch.cuda.stream(side):
            start.record()
            for _ in range(count):
                torch.mm(x, y, out=out)
            end.record()
        steps = 0
        while busy and not end.query():
            exchange()
            steps += 1
        end.synchronize()
        return start.elapsed_time(end), steps

    one = window(10, False)[0] / 10  # warms up, and sizes the window to ~200 ms
    count = max(10, min(1000, int(200 / max(one, 1e-3))))
    alone, busy, steps = [], [], 0
    for _ in range(max(phases, 3)):
        alone.append(window(count, False)[0])
        ms, k = window(count, True)
        busy.append(ms)
        steps += k
    a, b = percentile(alone, 0.5), percentile(busy, 0.5)
    return {"matmul_size": n, "matmuls_per_window": count, "window_ms_alone_p50": a,
            "window_ms_with_exchange_p50": b, "slowdown_percent": (b / a - 1) * 100,
            "exchange_steps_during": steps}


def interference_line(i: dict) -> str:
    return (f"interference: {i['matmuls_per_window']} matmuls of {i['matmul_size']}^2 bf16: "
            f"{i['window_ms_alone_p50']:.2f} ms alone, {i['window_ms_with_exchange_p50']:.2f} ms "
            f"beside the replayed step ({i['exchange_steps_during']} steps): slowdown "
            f"{i['slowdown_percent']:+.2f}%")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python3 -m hetmesh.bench_graph",
                                     description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, DEFAULT_JOB)
    parser.add_argument("--layers", type=int, default=8, help="round trips a step makes")
    add_phase_arguments(parser, each="steps", iterations=50, turns="the modes", phases=4, warmup=3)
    parser.add_argument("--no-chain", action="store_true",
                        help="no copy on the stream between layers: every layer sends the first "
                             "tokens again (the exchange alone, with no GPU work between)")
    parser.add_argument("--interference", type=int, default=0, metavar="N",
                        help="also time N x N matmuls alone and beside the replayed step (cuda)")
    args = parser.parse_args()
    if args.role == "ffn":
        serve(args.store, json.loads(args.job), args.ffn_device)
        return 0
    job = dict(DEFAULT_JOB, tokens=args.tokens, hidden=args.hidden,
               queue_depth=max(1, min(args.layers, 64)))
    r = measure(args, job)
    print(f"hetmesh.bench_graph: 1A1F, {job['tokens']} tokens x hidden {job['hidden']} (bf16 both "
          f"ways), A on {args.attention_device}, F on {args.ffn_device}; {args.layers} layers a "
          f"step, {args.iterations} steps per mode in {args.phases} alternating phases")
    print(f"{'mode':<8}{'layer p50 us':>14}{'layer p99 us':>14}{'host/step p50 us':>18}"
          f"{'/ host':>8}{'wrong':>7}")
    for m, v in r["modes"].items():
        print(f"{m:<8}{v['per_layer_us']['p50']:>14.1f}{v['per_layer_us']['p99']:>14.1f}"
              f"{v['host_per_step_us']['p50']:>18.1f}{v['over_host']:>8.3f}{v['wrong_answers']:>7}")
    if "interference" in r:
        print(interference_line(r["interference"]))
    t = r["device_trips"]
    print(f"device trips: rung {t['rung']} completed {t['completed']} failed {t['failed']}"
          + (f" (first: {t['failures'][0]})" if t["failures"] else ""))
    write_json(r, args.json)
    return 0 if all(v["wrong_answers"] == 0 for v in r["modes"].values()) and not t["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
