"""StepMesh's API's cost: fserver_lib's push_pull + wait against hetmesh's own Python path.

    python3 -m hetmesh.bench_stepmesh                        # 2A2F on the host
    python3 -m hetmesh.bench_stepmesh --device cuda --json out.json

StepMesh's 2A2F shape: two workers and two servers, each worker pushing 128 tokens of hidden 7168
(896 KiB of 1-byte elements, fp8's size) and pulling 128 x 7168 bf16 (1.75 MiB) from each server,
one round trip in flight. Every process of it runs two jobs of the same bytes side by side: one
through fserver_lib (a scheduler process hosts its store), one through hetmesh's engines from
Python (AttentionEngine.push_pull(send=, results_into=) + wait; the F's get_batch +
respond(outputs=)), both on the caller's own tensors. The workers run `--iterations` round trips of
one, then of the other, `--phases` times, each timed with time.perf_counter_ns around push_pull and
wait; the servers answer each from one tensor of their own. The shim's cost per round trip is the
difference of the two p50s (on worker 0).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import hetmesh
from hetmesh.bench import add_phase_arguments, free_port, percentile, run_info, write_json

WORKERS = SERVERS = 2


def bare_job(args) -> dict:
    return dict(attention=WORKERS, ffn=SERVERS, micro_batches=1, tokens=args.tokens,
                hidden=args.hidden, experts=SERVERS, top_k=0, a2f_dtype="fp8", f2a_dtype="bf16",
                timeout_ms=30000)


def devices(args) -> tuple[str, str]:
    """(the engines' device, torch's) for --device."""
    return ("cuda:0", "cuda:0") if args.device == "cuda" else ("cpu:0", "cpu")


def serve(args) -> None:
    """A server of both jobs: fserver_lib's loop and the bare engine's, each in a thread."""
    import fserver_lib as f

    torch = hetmesh.import_torch()
    rank = int(os.environ["DMLC_NODE_RANK"])
    f.init()
    engine_device, on = devices(args)
    bare = hetmesh.FfnEngine(rank=rank, store=args.store, device=engine_device, job="bare",
                             **bare_job(args))
    out = torch.ones(args.tokens, args.hidden, dtype=torch.bfloat16, device=on)

    def shim() -> None:
        while batches := f.get_batch():
            for handler, _, _ in batches:
                f.respond([out], handler)

    def own() -> None:
        for batch in bare.batches():
            bare.respond(batch, outputs=[out] * len(batch.parts))

    threads = [threading.Thread(target=shim), threading.Thread(target=own)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bare.close()
    f.stop()


def work(args) -> None:
    """A worker: the two jobs' round trips in turns; worker 0 prints the results as JSON."""
    import fserver_lib as f

    torch = hetmesh.import_torch()
    rank = int(os.environ["DMLC_NODE_RANK"])
    f.init()
    engine_device, on = devices(args)
    bare = hetmesh.AttentionEngine(rank=rank, store=args.store, device=engine_device, job="bare",
                                   **bare_job(args))
    x = torch.ones(args.tokens, args.hidden, dtype=torch.uint8, device=on)
    pulls = [torch.zeros(args.tokens, args.hidden, dtype=torch.bfloat16, device=on)
             for _ in range(SERVERS)]
    clock = time.perf_counter_ns

    keys = [1000 + s for s in range(SERVERS)]

    def phase(push, wait, n: int, ns: list[int], calls: list[int]) -> None:
        """n round trips: each push_pull + wait, and the push_pull's call alone."""
        for _ in range(n):
            start = clock()
            handle = push()
            pushed = clock()
            wait(handle)
            ns.append(clock() - start)
            calls.append(pushed - start)

    shim = (lambda: f.push_pull([x], [rank], pulls, keys), f.wait)
    own = (lambda: bare.push_pull(0, send=x, results_into=pulls), bare.wait)
    phase(*shim, args.warmup, [], [])
    phase(*own, args.warmup, [], [])
    shim_ns: list[int] = []
    own_ns: list[int] = []
    shim_calls: list[int] = []
    own_calls: list[int] = []
    for _ in range(args.phases):
        phase(*own, args.iterations, own_ns, own_calls)
        phase(*shim, args.iterations, shim_ns, shim_calls)
    counters = hetmesh.stepmesh._state["worker"].engine.counters()
    bare.finish()
    bare.close()
    f.stop()
    if rank == 0:
        print(json.dumps({"shim_ns": shim_ns, "own_ns": own_ns, "shim_calls": shim_calls,
                          "own_calls": own_calls, "shim_counters": counters}))


def measure(args) -> dict:
    folder = os.path.dirname(os.path.dirname(os.path.abspath(hetmesh.__file__)))
    bare_store = hetmesh.StoreServer()
    env = {**os.environ, "PYTHONPATH": folder, "DMLC_NUM_WORKER": str(WORKERS),
           "DMLC_NUM_SERVER": str(SERVERS), "DMLC_PS_ROOT_URI": "127.0.0.1",
           "DMLC_PS_ROOT_PORT": str(free_port()),
           "HETMESH_STEPMESH_MAX_BYTES": str(args.tokens * args.hidden * 2),
           "HETMESH_STEPMESH_TENSORS": "1", "HETMESH_STEPMESH_MICRO_BATCHES": "1"}
    if args.device == "cpu":
        env["HETMESH_STEPMESH_DEVICE"] = "cpu:0"
    command = [sys.executable, "-m", "hetmesh.bench_stepmesh", "--store", bare_store.address,
               "--device", args.device, "--tokens", str(args.tokens), "--hidden",
               str(args.hidden), "--iterations", str(args.iterations), "--phases",
               str(args.phases), "--warmup", str(args.warmup)]
    processes = [subprocess.Popen(command + ["--role", "scheduler"],
                                  env={**env, "DMLC_ROLE": "scheduler"})]
    for role, count in (("server", SERVERS), ("worker", WORKERS)):
        for rank in range(count):
            processes.append(subprocess.Popen(
                command + ["--role", role], stdout=subprocess.PIPE, text=True,
                env={**env, "DMLC_ROLE": role, "DMLC_NODE_RANK": str(rank)}))
    outputs = []
    try:
        for p in processes[1:]:
            out, _ = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise SystemExit(f"hetmesh.bench_stepmesh: a process failed ({p.returncode})")
            outputs.append(out)
        processes[0].wait(timeout=60)
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
        bare_store.close()
    worker0 = json.loads(next(o for o in outputs if o and o.strip().startswith("{")))
    shim_us = [n / 1000 for n in worker0["shim_ns"]]
    own_us = [n / 1000 for n in worker0["own_ns"]]
    shim_p50, own_p50 = percentile(shim_us, 0.5), percentile(own_us, 0.5)
    call_p50 = {key: percentile([n / 1000 for n in worker0[key]], 0.5)
                for key in ("shim_calls", "own_calls")}
    return {
        "run": run_info(), "device": args.device, "tokens": args.tokens, "hidden": args.hidden,
        "round_trips_per_side": len(shim_us),
        "hetmesh_python_round_trip_us": {"p50": own_p50, "p99": percentile(own_us, 0.99)},
        "fserver_lib_round_trip_us": {"p50": shim_p50, "p99": percentile(shim_us, 0.99)},
        "fserver_lib_cost_us_p50": shim_p50 - own_p50,
        # push_pull's call alone (no wait): what each path's Python costs the worker's thread
        "push_pull_call_us_p50": {"hetmesh": call_p50["own_calls"],
                                  "fserver_lib": call_p50["shim_calls"]},
        "fserver_lib_counters": worker0["shim_counters"],
        # every round trip (us), for CDFs (python3 -m hetmesh.plot)
        "samples_us": {"hetmesh_python": own_us, "fserver_lib": shim_us},
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python3 -m hetmesh.bench_stepmesh",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="every instance's: the host, or cuda:0")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=7168)
    add_phase_arguments(parser, each="round trips", iterations=200, turns="both paths", phases=5,
                        warmup=20)
    parser.add_argument("--json", help="also write the results here ('-': stdout)")
    parser.add_argument("--role", choices=("scheduler", "server", "worker"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "scheduler":
        import fserver_lib as f

        f.init()
        f.stop()
        return 0
    if args.role == "server":
        serve(args)
        return 0
    if args.role == "worker":
        work(args)
        return 0
    r = measure(args)
    print(f"hetmesh.bench_stepmesh: 2A2F, {args.tokens} x {args.hidden} out (1-byte elements) and "
          f"bf16 back from each F, every instance on {args.device}; "
          f"{r['round_trips_per_side']} round trips per side, one in flight, in {args.phases} "
          f"alternating phases")
    print(f"{'':<40}{'p50 us':>10}{'p99 us':>10}")
    for name, key in (("hetmesh's Python path (push_pull+wait)", "hetmesh_python_round_trip_us"),
                      ("fserver_lib (push_pull+wait)", "fserver_lib_round_trip_us")):
        print(f"{name:<40}{r[key]['p50']:>10.1f}{r[key]['p99']:>10.1f}")
    calls = r["push_pull_call_us_p50"]
    print(f"push_pull's call alone (p50): hetmesh {calls['hetmesh']:.1f} us, fserver_lib "
          f"{calls['fserver_lib']:.1f} us")
    print(f"fserver_lib's cost per round trip: {r['fserver_lib_cost_us_p50']:.2f} us (p50); "
          f"its counters {r['fserver_lib_counters']}")
    write_json(r, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
