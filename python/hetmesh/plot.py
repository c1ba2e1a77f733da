"""Figures from the benchmarks' JSON (docs/benchmarks.md), each beside the same-run baselines the
JSON carries.

    python3 -m hetmesh.plot RESULT.json [RESULT.json ...] --out DIR

- `hetmesh bench transport --json`: bandwidth against size (the transport; memcpy; one DMA through
  the source's plugin; ucx_perftest or ib_write_bw where they ran), and the one-way latency's CDF
  at each size beside memcpy's and one DMA's.
- `python3 -m hetmesh.bench_stepmesh --json`: the round trip's CDF through fserver_lib and through
  hetmesh's own Python path.

Writes DIR/<the JSON's name>-<figure>.png (matplotlib's Agg backend: no display needed) and
prints each path. A JSON of another shape is refused by name.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _size(n: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _cdf(axes, samples, label: str) -> None:
    """samples (us) as a CDF line: the i-th smallest at (i+1)/n."""
    xs = sorted(samples)
    axes.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=label)


def _title(result: dict, what: str) -> str:
    run = result.get("run", {})
    return f"{what}\n{run.get('host', '?')}, {run.get('date', '?')}"


def transport_figures(result: dict) -> dict:
    plt = _pyplot()
    rows = result["rows"]
    sizes = [r["size"] for r in rows]
    what = (f"bench transport: {result['transport']}, {result['memory']} -> "
            f"{result['peer_memory']}")
    figures = {}
    fig, axes = plt.subplots(figsize=(7, 4.5))
    series = [("hetmesh " + result["transport"], "bandwidth_GBps"), ("memcpy", "memcpy_GBps"),
              ("one DMA (plugin)", "one_dma_GBps"), ("ucx_perftest", "ucx_bw_GBps"),
              ("ib_write_bw", "ib_write_bw_GBps")]
    for label, key in series:
        points = [(r["size"], r[key]) for r in rows if r.get(key)]
        if points:
            axes.plot(*zip(*points), marker="o", label=label)
    axes.set_xscale("log", base=2)
    axes.set_xticks(sizes, [_size(s) for s in sizes])
    axes.set_xlabel("write size (bytes)")
    axes.set_ylabel("GB/s")
    axes.set_title(_title(result, what), fontsize=9)
    axes.legend()
    axes.grid(alpha=0.3)
    figures["bandwidth"] = fig
    for r in rows:
        if not r.get("latency_samples_us"):
            continue
        fig, axes = plt.subplots(figsize=(7, 4.5))
        _cdf(axes, r["latency_samples_us"], f"hetmesh {result['transport']} (one way)")
        for label, key in (("memcpy", "memcpy_samples_us"), ("one DMA (plugin)",
                                                            "one_dma_samples_us")):
            if r.get(key):
                _cdf(axes, r[key], label)
        axes.set_xscale("log")
        axes.set_xlabel("latency (us)")
        axes.set_ylabel("fraction of samples")
        axes.set_title(_title(result, f"{what}, {_size(r['size'])}"), fontsize=9)
        axes.legend()
        axes.grid(alpha=0.3)
        figures[f"latency-{_size(r['size'])}"] = fig
    return figures


def stepmesh_figures(result: dict) -> dict:
    plt = _pyplot()
    fig, axes = plt.subplots(figsize=(7, 4.5))
    samples = result["samples_us"]
    _cdf(axes, samples["hetmesh_python"], "hetmesh's Python path (baseline)")
    _cdf(axes, samples["fserver_lib"], "fserver_lib")
    axes.set_xscale("log")
    axes.set_xlabel("push_pull + wait (us)")
    axes.set_ylabel("fraction of round trips")
    axes.set_title(_title(result, f"bench_stepmesh: 2A2F, {result['tokens']} x "
                                  f"{result['hidden']}, {result['device']}"), fontsize=9)
    axes.legend()
    axes.grid(alpha=0.3)
    return {"round-trip": fig}


def figures(result: dict, name: str) -> dict:
    """The figures of one benchmark's JSON, by figure name; ValueError naming `name` for a JSON of
    no known shape."""
    if "transport" in result and "rows" in result:
        return transport_figures(result)
    if "fserver_lib_round_trip_us" in result and "samples_us" in result:
        return stepmesh_figures(result)
    raise ValueError(f"{name}: not the JSON of hetmesh bench transport or of "
                     f"hetmesh.bench_stepmesh (with its samples): no figure for it")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m hetmesh.plot",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="a benchmark's --json output")
    parser.add_argument("--out", default=".", help="the folder for the PNGs")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    plt = _pyplot()
    for path in args.results:
        try:
            with open(path) as f:
                result = json.load(f)
            drawn = figures(result, path)
        except (OSError, ValueError, KeyError) as error:
            print(f"hetmesh.plot: {path}: {error!r}" if isinstance(error, KeyError)
                  else f"hetmesh.plot: {error}", file=sys.stderr)
            return 1
        stem = os.path.splitext(os.path.basename(path))[0]
        for figure_name, fig in drawn.items():
            out = os.path.join(args.out, f"{stem}-{figure_name}.png")
            fig.tight_layout()
            fig.savefig(out, dpi=110)
            plt.close(fig)
            print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
