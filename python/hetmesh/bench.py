"""The Python path's cost: one job, its round trips driven from Python and from C++ in turns.

    python3 -m hetmesh.bench                                  # 1A1F, StepMesh's per-A traffic
    python3 -m hetmesh.bench --attention-device cuda:0 --json out.json

One attention engine in this process, its FFN instance in another (Python, the same in both
phases). In each phase the engine does `--iterations` round trips of one micro-batch alone in
flight (push_pull, then wait): from Python (timed with time.perf_counter_ns around the two calls)
and from C++ (the same two calls in a native loop, timed around them the same way). The phases
alternate `--phases` times, so both see the same machine state. Python's overhead per round trip
is the difference of the two p50s.

A third phase splits that overhead: one C++ round trip per call from a Python loop, timed inside
C++. Its p50 over the native loop's is what the interpreter's running between round trips
costs the round trip itself (caches, the peer's timing); Python's over it is the binding's two
calls.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import time

import hetmesh

# StepMesh's per-A traffic: 128 tokens of hidden 7168, fp8 out (896 KiB) and bf16 back (1.75 MiB).
DEFAULT_JOB = dict(attention=1, ffn=1, micro_batches=1, tokens=128, hidden=7168, experts=8,
                   top_k=8, a2f_dtype="fp8", f2a_dtype="bf16", timeout_ms=30000)


def percentile(samples: list[float], q: float) -> float:
    """The q-quantile by core's one rule, mirrored (core/include/hetmesh/core/percentile.hpp; the
    module does not expose it): the sample at index round(q * (n - 1)) of the sorted samples,
    halves rounded up; 0 for no samples."""
    if not 0 <= q <= 1:
        raise ValueError(f"percentile {q}: not in [0, 1]")
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[int(q * (len(ordered) - 1) + 0.5)]


def run_info() -> dict:
    """Where and when a benchmark ran, for its JSON."""
    return {"host": platform.node(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "hetmesh_version": hetmesh.__version__, "python": platform.python_version()}


def write_json(results: dict, path: str | None) -> None:
    """The results as JSON to `path` ('-': stdout; None: nowhere)."""
    if path == "-":
        json.dump(results, sys.stdout, indent=1)
        print()
    elif path:
        with open(path, "w") as out:
            json.dump(results, out, indent=1)


def add_phase_arguments(parser, *, each: str, iterations: int, turns: str, phases: int,
                        warmup: int | None = None) -> None:
    """--iterations, --phases and (where the bench warms up) --warmup: the paths a bench compares
    run `phases` times in turns, `iterations` of `each` a phase."""
    parser.add_argument("--iterations", type=int, default=iterations, help=f"{each} per phase")
    parser.add_argument("--phases", type=int, default=phases, help=f"{turns}, in turns")
    if warmup is not None:
        parser.add_argument("--warmup", type=int, default=warmup)


def add_common_arguments(parser, job: dict, roles=("ffn",)) -> None:
    """The options every Python bench takes: the devices, the shape (`job`'s by default), --json,
    and the hidden ones its own F processes are started with (ffn_processes)."""
    parser.add_argument("--attention-device", default="cpu:0")
    parser.add_argument("--ffn-device", default="cpu:0")
    parser.add_argument("--tokens", type=int, default=job["tokens"])
    parser.add_argument("--hidden", type=int, default=job["hidden"])
    parser.add_argument("--json", help="also write the results here ('-': stdout)")
    parser.add_argument("--role", choices=list(roles), help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)


def free_port() -> int:
    """A TCP port of the loopback interface that nothing holds now, nor the next one (under
    torchrun, hetmesh's store takes MASTER_PORT + 1), for a launcher's root address. Below the
    kernel's ephemeral range: a port from there is never handed to another socket's bind-to-0 or
    connect between this check and its user's bind (one was, once, and a CI run failed)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    for _ in range(200):
        port = random.randrange(10000, max(low, 10004) - 2)
        try:
            for p in (port, port + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no free pair of loopback ports below {low}")


@contextlib.contextmanager
def ffn_processes(module: str, job: dict, args, roles=("ffn",), extra=()):
    """A store of a new job secret hosted here, and for each of `roles` an F in a process of its
    own (`python3 -m MODULE --role ROLE ...`, `extra` appended); yields (the store's address, the
    secret's file). On the way out each F must have ended well."""
    with tempfile.TemporaryDirectory(prefix="hetmesh-pybench-") as folder:
        secret = os.path.join(folder, "job.secret")
        hetmesh.write_secret(secret)
        store = hetmesh.StoreServer(secret_file=secret)
        ffns = [subprocess.Popen([sys.executable, "-m", module, "--role", role, "--store",
                                  store.address, "--job", json.dumps(job), "--ffn-device",
                                  args.ffn_device, *extra],
                                 env={**os.environ, "HETMESH_JOB_SECRET_FILE": secret})
                for role in roles]
        try:
            yield store.address, secret
        finally:
            for ffn in ffns:
                if ffn.wait(timeout=60) != 0:
                    raise SystemExit(f"{module}: an FFN instance failed ({ffn.returncode})")
            store.close()


def serve(store: str, job: dict, device: str) -> None:
    f = hetmesh.FfnEngine(rank=0, store=store, device=device, **job)
    for batch in f.batches():
        f.respond(batch)


def measure(args, job: dict) -> dict:
    with ffn_processes("hetmesh.bench", job, args) as (store, secret):
        a = hetmesh.AttentionEngine(rank=0, store=store, secret_file=secret,
                                    device=args.attention_device, **job)
        cpp_ns: list[int] = []
        python_ns: list[int] = []
        between_ns: list[int] = []  # one C++ round trip per call from Python
        clock = time.perf_counter_ns
        a._round_trips_from_cpp(0, args.warmup)
        for _ in range(args.phases):
            cpp_ns += a._round_trips_from_cpp(0, args.iterations)
            for _ in range(args.iterations):
                start = clock()
                a.wait(a.push_pull(0))
                python_ns.append(clock() - start)
            for _ in range(args.iterations):
                between_ns += a._round_trips_from_cpp(0, 1)
        a.finish()
    cpp_us = [n / 1000 for n in cpp_ns]
    python_us = [n / 1000 for n in python_ns]
    between_us = [n / 1000 for n in between_ns]
    cpp_p50, python_p50 = percentile(cpp_us, 0.5), percentile(python_us, 0.5)
    between_p50 = percentile(between_us, 0.5)
    return {
        "run": run_info(),
        "job": job, "attention_device": args.attention_device, "ffn_device": args.ffn_device,
        "round_trips_per_side": len(cpp_us),
        "cpp_round_trip_us": {"p50": cpp_p50, "p99": percentile(cpp_us, 0.99)},
        "python_round_trip_us": {"p50": python_p50, "p99": percentile(python_us, 0.99)},
        "cpp_one_per_python_call_us": {"p50": between_p50, "p99": percentile(between_us, 0.99)},
        "python_overhead_us_p50": python_p50 - cpp_p50,
        "interpreter_between_round_trips_us_p50": between_p50 - cpp_p50,
        "binding_calls_us_p50": python_p50 - between_p50,
        "python_over_cpp": python_p50 / cpp_p50,
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python3 -m hetmesh.bench",
                                     description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, DEFAULT_JOB)
    add_phase_arguments(parser, each="round trips", iterations=200, turns="C++ and Python phases",
                        phases=5, warmup=50)
    args = parser.parse_args()
    if args.role == "ffn":
        serve(args.store, json.loads(args.job), args.ffn_device)
        return 0
    job = dict(DEFAULT_JOB, tokens=args.tokens, hidden=args.hidden)
    r = measure(args, job)
    print(f"hetmesh.bench: 1A1F, {job['tokens']} tokens x hidden {job['hidden']} "
          f"({job['a2f_dtype']} out, {job['f2a_dtype']} back), A on {args.attention_device}, "
          f"F on {args.ffn_device}; {r['round_trips_per_side']} round trips per side, one in "
          f"flight, C++ and Python in {args.phases} alternating phases")
    print(f"{'driven from':<14}{'p50 us':>10}{'p99 us':>10}")
    print(f"{'C++':<14}{r['cpp_round_trip_us']['p50']:>10.1f}{r['cpp_round_trip_us']['p99']:>10.1f}")
    print(f"{'Python':<14}{r['python_round_trip_us']['p50']:>10.1f}"
          f"{r['python_round_trip_us']['p99']:>10.1f}")
    print(f"{'C++, 1/call':<14}{r['cpp_one_per_python_call_us']['p50']:>10.1f}"
          f"{r['cpp_one_per_python_call_us']['p99']:>10.1f}   (one C++ round trip per call from "
          f"a Python loop)")
    print(f"Python overhead per push_pull + wait: {r['python_overhead_us_p50']:.2f} us (p50), "
          f"{r['python_over_cpp']:.3f}x the C++ round trip: "
          f"{r['binding_calls_us_p50']:.2f} us the binding's two calls, "
          f"{r['interpreter_between_round_trips_us_p50']:.2f} us the interpreter between round "
          f"trips")
    write_json(r, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
