"""A host that queues a stage's layers ahead: `--layers` round trips of one micro-batch pushed at
once (queue_depth of them in flight), against the same round trips pushed and waited for one by
one, in alternating phases of one job.

    python3 -m hetmesh.bench_queue                            # 8 layers, StepMesh's per-A shape
    python3 -m hetmesh.bench_queue --attention-device cuda:0 --json out.json

Each layer sends from a tensor of its own and its answer lands in another of its own (the
application's buffers), so nothing a queued layer reads is overwritten by the one after it; the F
answers each part with its tokens + 1, and every answer is checked against its own layer's input,
in order (its first row: the F computes only that one, so the benchmark measures the exchange,
not the F's arithmetic). Reported per layer: the waited and the queued time (a phase's wall time
over its layers), the host's time to push all the layers of a queued phase, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import hetmesh
from hetmesh.bench import (add_common_arguments, add_phase_arguments, ffn_processes, percentile,
                           run_info, write_json)

# StepMesh's per-A traffic, bf16 both ways (so a tensor holds its answer's bytes), no routing.
DEFAULT_JOB = dict(attention=1, ffn=1, micro_batches=1, queue_depth=8, tokens=128, hidden=7168,
                   experts=1, top_k=0, a2f_dtype="bf16", f2a_dtype="bf16", timeout_ms=30000)


def serve(store: str, job: dict, device: str) -> None:
    """The F: each part's first output row is its first token + 1 (the rest is left as it is)."""
    f = hetmesh.FfnEngine(rank=0, store=store, device=device, **job)
    # On a GPU the answer goes out once torch's stream has computed it.
    stream = hetmesh.import_torch().cuda.current_stream() if device.startswith("cuda") else None
    for batch in f.batches():
        for part in batch.parts:
            first = hetmesh.as_tensor(part.tokens)[:1]
            hetmesh.as_tensor(part.output)[:1].copy_(first.float() + 1)
        f.respond(batch, stream=stream)


def measure(args, job: dict) -> dict:
    torch = hetmesh.import_torch()
    on = "cuda:0" if args.attention_device.startswith("cuda") else "cpu"
    layers = args.layers
    with ffn_processes("hetmesh.bench_queue", job, args) as (store, secret):
        with hetmesh.AttentionEngine(rank=0, store=store, secret_file=secret,
                                     device=args.attention_device, **job) as a:
            shape = (job["tokens"], job["hidden"])
            sent = [torch.full(shape, float(layer % 64), dtype=torch.bfloat16, device=on)
                    for layer in range(layers)]
            answers = [torch.zeros(shape, dtype=torch.bfloat16, device=on) for _ in sent]
            stream = torch.cuda.current_stream() if on != "cpu" else None
            clock = time.perf_counter_ns
            waited_ns, queued_ns, pushing_ns = [], [], []
            wrong = 0

            def check() -> int:  # each layer's answer is its own, in order
                return sum(not torch.equal(answer[:1], x[:1].float().add(1).to(torch.bfloat16))
                           for x, answer in zip(sent, answers))

            def waited() -> None:
                start = clock()
                for x, y in zip(sent, answers):
                    a.wait(a.push_pull(0, send=x, results_into=y, stream=stream))
                waited_ns.append((clock() - start) // layers)

            def queued() -> None:
                start = clock()
                handles = [a.push_pull(0, send=x, results_into=y, stream=stream)
                           for x, y in zip(sent, answers)]
                pushed = clock()
                for handle in handles:  # in order
                    a.wait(handle)
                queued_ns.append((clock() - start) // layers)
                pushing_ns.append(pushed - start)

            for _ in range(args.warmup):
                waited(), queued()
            waited_ns.clear(), queued_ns.clear(), pushing_ns.clear()
            for _ in range(args.phases):
                for _ in range(args.iterations):
                    for y in answers:
                        y[:1].zero_()
                    waited()
                    wrong += check()
                for _ in range(args.iterations):
                    for y in answers:
                        y[:1].zero_()
                    queued()
                    wrong += check()
            a.finish()  # a failure above ends the engine on its way out: the F hears
    waited_us = [n / 1000 for n in waited_ns]
    queued_us = [n / 1000 for n in queued_ns]
    pushing_us = [n / 1000 for n in pushing_ns]
    waited_p50, queued_p50 = percentile(waited_us, 0.5), percentile(queued_us, 0.5)
    return {
        "run": run_info(),
        "job": job, "attention_device": args.attention_device, "ffn_device": args.ffn_device,
        "layers": layers, "stages_per_side": len(waited_us), "wrong_answers": wrong,
        "waited_per_layer_us": {"p50": waited_p50, "p99": percentile(waited_us, 0.99)},
        "queued_per_layer_us": {"p50": queued_p50, "p99": percentile(queued_us, 0.99)},
        "pushing_all_layers_us": {"p50": percentile(pushing_us, 0.5),
                                  "p99": percentile(pushing_us, 0.99)},
        "queued_over_waited": queued_p50 / waited_p50,
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python3 -m hetmesh.bench_queue",
                                     description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, DEFAULT_JOB)
    parser.add_argument("--layers", type=int, default=8, help="round trips a stage queues")
    add_phase_arguments(parser, each="stages", iterations=50, turns="waited and queued", phases=4,
                        warmup=3)
    args = parser.parse_args()
    if args.role == "ffn":
        serve(args.store, json.loads(args.job), args.ffn_device)
        return 0
    job = dict(DEFAULT_JOB, tokens=args.tokens, hidden=args.hidden,
               queue_depth=max(1, min(args.layers, 64)))
    r = measure(args, job)
    print(f"hetmesh.bench_queue: 1A1F, {job['tokens']} tokens x hidden {job['hidden']} (bf16 both "
          f"ways), A on {args.attention_device}, F on {args.ffn_device}; {args.layers} layers a "
          f"stage, {r['stages_per_side']} stages per mode in {args.phases} alternating phases; "
          f"answers wrong: {r['wrong_answers']}")
    print(f"{'per layer':<30}{'p50 us':>10}{'p99 us':>10}")
    for name, key in (("waited (push, wait, ...)", "waited_per_layer_us"),
                      ("queued (all pushed, then waits)", "queued_per_layer_us"),
                      ("pushing all layers (host)", "pushing_all_layers_us")):
        print(f"{name:<30}{r[key]['p50']:>10.1f}{r[key]['p99']:>10.1f}")
    print(f"queued / waited per layer: {r['queued_over_waited']:.3f}")
    write_json(r, args.json)
    return 0 if r["wrong_answers"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
