"""The vLLM connector's cost: a layer exchange through hetmesh.vllm_afd against the bare engine's.

    python3 -m hetmesh.bench_vllm                                   # 1A1F on cpu:0
    python3 -m hetmesh.bench_vllm --attention-device cuda:0 --json out.json

Two jobs of the same shape (the connector's: bf16 both ways, `topology = "groups"`) run side by
side, each with its F in a process of its own: the bare one answers from its slots (get_batch,
respond), the connector's as the plugin's FFN runner does (recv_attn_output, send_ffn_output, the
output in a tensor of its own). In turns, `--phases` times: the bare engine's round trips from C++
(push_pull + wait on its slots, each alone in flight), then the connector's layer exchanges from
Python (one step of --iterations layers) (send_attn_output + recv_ffn_output on the A's own tensor, one stage, each alone in flight,
timed with time.perf_counter_ns around the two calls). The connector's cost per layer is the
difference of the two p50s. Where it goes: the CPU time of each side's calling thread per
exchange (the A's here, each F's on its stderr), which the host's other load does not inflate.

With --device-trigger the connector's job runs its device-triggered mode (hetmesh.vllm_afd_device:
each call only enqueues on the stream), each layer's exchange timed through its stream's
synchronize; on a GPU the A's step of --iterations layers is also captured in a CUDA graph and
replayed, timed per layer and by the host's time per step (one replay call); --interference N
then times N x N matmuls alone and beside that replayed step (hetmesh.bench_graph's measure).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import hetmesh
from hetmesh import vllm_afd
from hetmesh.bench import (add_common_arguments, add_phase_arguments, ffn_processes, percentile,
                           run_info, write_json)
from hetmesh.bench_graph import interference_line, matmul_interference


def thread_cpu_line(who: str, cpu_ns: int, count: int, each: str) -> str:
    """Where an exchange's cost goes, robust where the host's CPUs are shared: the CPU time of the
    thread that made the calls (not the engine's threads, which may spin), per exchange."""
    return (f"hetmesh.bench_vllm: {who}: {cpu_ns / 1000 / max(count, 1):.1f} us of its calling "
            f"thread's CPU per {each} ({count})")


def serve_bare(store: str, job: dict, device: str) -> None:
    f = hetmesh.FfnEngine(rank=0, store=store, device=device, job="bare", **job)
    count, start = 0, time.thread_time_ns()
    for batch in f.batches():
        f.respond(batch)
        count += 1
    print(thread_cpu_line("the bare F", time.thread_time_ns() - start, count, "batch"),
          file=sys.stderr, flush=True)


def connector(role: str, store: str, args, hosts: bool) -> vllm_afd.AfdConnector:
    torch = hetmesh.import_torch()
    device = args.attention_device if role == "attention" else args.ffn_device
    c = vllm_afd.AfdConnector(role=role, role_rank=0, attention=1, ffn=1, hidden=args.hidden,
                              dtype=torch.bfloat16, max_tokens=args.tokens, default_store=store,
                              options={"device": device, "job": "connector", "micro_batches": 1,
                                       "host_store": hosts, "timeout_ms": 30000,
                                       "device_trigger": args.device_trigger})
    c.init_afd_connector()
    return c


def serve_connector(store: str, args) -> None:
    """The plugin's FFN runner: each step's payload, then --iterations layers of stage 0."""
    torch = hetmesh.import_torch()
    c = connector("ffn", store, args, hosts=False)
    on = "cuda:0" if c.device.startswith("cuda") else "cpu"
    out = torch.zeros(args.tokens, args.hidden, dtype=torch.bfloat16, device=on)
    count, start = 0, time.thread_time_ns()
    while True:
        try:
            payload = c.control_plane.recv_dp_metadata_list()
        except hetmesh.ClosedError:
            break
        c.control_plane.update_state_from_dp_metadata(payload)
        for _ in range(args.iterations):
            got = c.recv_attn_output(ubatch_idx=0)
            c.send_ffn_output(out[:got.hidden_states.shape[0]], got.context)
        count += args.iterations
    print(thread_cpu_line("the connector's F", time.thread_time_ns() - start, count, "layer"),
          file=sys.stderr)
    print(f"hetmesh.bench_vllm: the connector's F: {c.counters()}", file=sys.stderr, flush=True)
    c.close()


def measure(args) -> dict:
    torch = hetmesh.import_torch()
    job = vllm_afd.AfdConnector(role="attention", role_rank=0, attention=1, ffn=1,
                                hidden=args.hidden, dtype=torch.bfloat16, max_tokens=args.tokens,
                                options={"micro_batches": 1, "timeout_ms": 30000}).job
    extra = ["--tokens", str(args.tokens), "--hidden", str(args.hidden), "--iterations",
             str(args.iterations)] + (["--device-trigger"] if args.device_trigger else [])
    with ffn_processes("hetmesh.bench_vllm", job, args, roles=("bare-ffn", "connector-ffn"),
                       extra=extra) as (store, secret):
        bare = hetmesh.AttentionEngine(rank=0, store=store, secret_file=secret,
                                       device=args.attention_device, job="bare", **job)
        os.environ["HETMESH_JOB_SECRET_FILE"] = secret
        a = connector("attention", store, args, hosts=False)
        on = "cuda:0" if a.device.startswith("cuda") else "cpu"
        x = torch.ones(args.tokens, args.hidden, dtype=torch.bfloat16, device=on)
        context = vllm_afd.TransferContext(vllm_afd.TransferMetadata(0, 0, [args.tokens]))
        clock = time.perf_counter_ns

        # With --device-trigger the exchange is done once the stream is (on the host, the
        # receive synchronized it).
        sync = torch.cuda.current_stream().synchronize if args.device_trigger and on != "cpu" \
            else (lambda: None)

        def control() -> None:
            counts = torch.tensor([args.tokens], dtype=torch.int32)
            payload = vllm_afd.ControlPayload({0: vllm_afd.DPMetadata(counts)})
            a.control_plane.update_state_from_dp_metadata(payload)
            a.control_plane.send_dp_metadata_list(payload)

        def step() -> list[int]:  # one step of --iterations layers
            control()
            ns = []
            for _ in range(args.iterations):
                start = clock()
                a.send_attn_output(x, context)
                a.recv_ffn_output(x, 0)
                sync()
                ns.append(clock() - start)
            return ns

        graph = None
        if args.device_trigger and on != "cpu":
            step()  # warm-up, then the same layers captured (the F serves them as any step)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(args.iterations):
                    a.send_attn_output(x, context)
                    a.recv_ffn_output(x, 0)
        graph_ns: list[int] = []
        host_ns: list[int] = []

        def replay() -> None:  # one step: its payload, one replay call, the stream's end
            control()
            start = clock()
            graph.replay()
            issued = clock()
            sync()
            graph_ns.append((clock() - start) // args.iterations)
            host_ns.append(issued - start)

        bare._round_trips_from_cpp(0, args.iterations)  # warm-up
        step()
        bare_ns: list[int] = []
        connector_ns: list[int] = []
        cpu_ns = {"bare": 0, "connector": 0}
        for _ in range(args.phases):
            start = time.thread_time_ns()
            bare_ns += bare._round_trips_from_cpp(0, args.iterations)
            middle = time.thread_time_ns()
            connector_ns += step()
            cpu_ns["bare"] += middle - start
            cpu_ns["connector"] += time.thread_time_ns() - middle
            for _ in range(graph is not None and 20):
                replay()
        interference = None
        if graph is not None and args.interference:
            def exchange() -> None:
                control()
                graph.replay()
                sync()
            interference = matmul_interference(torch, args.interference, exchange, args.phases)
        if graph is not None:
            a.check_round_trips()
        counters = a.counters()
        a.close()
        bare.finish()
    bare_us = [n / 1000 for n in bare_ns]
    graph_us = [n / 1000 for n in graph_ns]
    host_us = [n / 1000 for n in host_ns]
    connector_us = [n / 1000 for n in connector_ns]
    bare_p50, connector_p50 = percentile(bare_us, 0.5), percentile(connector_us, 0.5)
    return {
        "run": run_info(),
        "job": job, "attention_device": args.attention_device, "ffn_device": args.ffn_device,
        "exchanges_per_side": len(bare_us),
        "bare_cpp_round_trip_us": {"p50": bare_p50, "p99": percentile(bare_us, 0.99)},
        "connector_layer_exchange_us": {"p50": connector_p50,
                                        "p99": percentile(connector_us, 0.99)},
        "connector_cost_us_p50": connector_p50 - bare_p50,
        "calling_thread_cpu_us_per_exchange": {
            side: ns / 1000 / max(len(bare_us), 1) for side, ns in cpu_ns.items()},
        "connector_counters": counters,
        "device_trigger": args.device_trigger,
        **({"graph_layer_exchange_us": {"p50": percentile(graph_us, 0.5),
                                        "p99": percentile(graph_us, 0.99)},
            "graph_host_us_per_step": {"p50": percentile(host_us, 0.5),
                                       "p99": percentile(host_us, 0.99)},
            "graph_replays": len(graph_ns)} if graph_ns else {}),
        **({"interference": interference} if interference else {}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python3 -m hetmesh.bench_vllm",
                                     description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, {"tokens": 128, "hidden": 7168},
                         roles=("bare-ffn", "connector-ffn"))
    add_phase_arguments(parser, each="exchanges", iterations=200, turns="bare and connector",
                        phases=5)
    parser.add_argument("--device-trigger", action="store_true",
                        help="the connector's device_trigger mode (on a GPU, also captured)")
    parser.add_argument("--interference", type=int, default=0, metavar="N",
                        help="with --device-trigger on a GPU: N x N matmuls alone and beside it")
    args = parser.parse_args()
    if args.role == "bare-ffn":
        serve_bare(args.store, json.loads(args.job), args.ffn_device)
        return 0
    if args.role == "connector-ffn":
        serve_connector(args.store, args)
        return 0
    r = measure(args)
    print(f"hetmesh.bench_vllm: 1A1F, {args.tokens} tokens x hidden {args.hidden} (bf16 both "
          f"ways), A on {args.attention_device}, F on {args.ffn_device}; "
          f"{r['exchanges_per_side']} exchanges per side, one in flight, in {args.phases} "
          f"alternating phases")
    print(f"{'':<34}{'p50 us':>10}{'p99 us':>10}")
    for name, key in (("bare engine (C++ push_pull+wait)", "bare_cpp_round_trip_us"),
                      ("connector (send_attn+recv_ffn)", "connector_layer_exchange_us")):
        print(f"{name:<34}{r[key]['p50']:>10.1f}{r[key]['p99']:>10.1f}")
    if "graph_layer_exchange_us" in r:
        g, h = r["graph_layer_exchange_us"], r["graph_host_us_per_step"]
        print(f"{'connector, graph replayed':<34}{g['p50']:>10.1f}{g['p99']:>10.1f}  (per layer; "
              f"the host's time per step {h['p50']:.1f} us p50, {r['graph_replays']} replays)")
    if "interference" in r:
        print(interference_line(r["interference"]))
    cpu = r["calling_thread_cpu_us_per_exchange"]
    print(f"the A's calling thread's CPU per exchange: bare {cpu['bare']:.1f} us, connector "
          f"{cpu['connector']:.1f} us (each F's on stderr)")
    print(f"connector cost per layer exchange: {r['connector_cost_us_p50']:.2f} us (p50); "
          f"its counters {r['connector_counters']}")
    write_json(r, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
