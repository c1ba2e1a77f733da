#!/usr/bin/env python3
"""Prints the ratios of ci/gpu/afd.sh's same-run figures (the folder of its JSON files)."""
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])


def load(name):
    path = out / name
    return json.loads(path.read_text()) if path.exists() else None


bench = load("bench-afd.json")
trips = load("baselines-roundtrip.json")
nccl_interference = load("baselines-interference-nccl.json")
alone = load("compute-alone.json")
with_hetmesh = load("compute-with-hetmesh.json")

if bench and trips:
    hm = bench["metrics"]["round trip"]
    peer, nccl = trips["peer_copy_pair"], trips["nccl"]
    print(f"AFD round trip, A cuda:{trips['a']} <-> F cuda:{trips['f']}, "
          f"{trips['a2f_bytes']} B out, {trips['f2a_bytes']} B back (us):")
    print(f"  {'':24}{'p50':>9}{'p99':>9}")
    print(f"  {'hetmesh (ipc)':24}{hm['p50_us']:9.1f}{hm['p99_us']:9.1f}")
    print(f"  {'cudaMemcpyPeerAsync pair':24}{peer['p50_us']:9.1f}{peer['p99_us']:9.1f}")
    print(f"  {'NCCL send/recv':24}{nccl['p50_us']:9.1f}{nccl['p99_us']:9.1f}")
    for key, name in (("peer_copy_pair_events", "pair, polled events"),
                      ("peer_copy_pair_flags", "pair, GPU-written flags")):
        if key in trips:
            print(f"  {name:24}{trips[key]['p50_us']:9.1f}{trips[key]['p99_us']:9.1f}")
    print(f"  hetmesh / NCCL p50      {hm['p50_us'] / nccl['p50_us']:.2f}x   (target <= 0.7)")
    print(f"  hetmesh / peer pair p50 {hm['p50_us'] / peer['p50_us']:.2f}x   (target <= 1.5)")
if nccl_interference:
    a = nccl_interference["compute_alone"]["p50_ms"]
    n = nccl_interference["compute_with_nccl"]["p50_ms"]
    print(f"compute kernel on cuda:{nccl_interference['f']} (p50 ms): alone {a:.3f}, with NCCL "
          f"traffic in-process {n:.3f} -> slowdown {(n / a - 1) * 100:.2f}% "
          f"({nccl_interference['nccl_round_trips_during']} NCCL round trips during)")
    during = nccl_interference["nccl_round_trip_during_compute"]
    print(f"  NCCL's own round trip meanwhile: p50 {during['p50_us']:.1f} us, "
          f"p99 {during['p99_us']:.1f} us (its kernels wait for SMs)")
if with_hetmesh and with_hetmesh["kernels"] == 0:
    print("compute kernel while hetmesh moves the traffic: NOT MEASURED (the bench ended first)")
elif alone and with_hetmesh:
    a = alone["compute"]["p50_ms"]
    h = with_hetmesh["compute"]["p50_ms"]
    print(f"compute kernel on cuda:{alone['f']} (p50 ms, own process): alone {a:.3f}, while hetmesh "
          f"moves the traffic {h:.3f} -> slowdown {(h / a - 1) * 100:.2f}% (target < 1%)")
    loaded = load("bench-afd-during-compute.json")
    if loaded:
        trip = loaded["metrics"]["round trip"]
        print(f"  hetmesh's own round trip meanwhile: p50 {trip['p50_us']:.1f} us, "
              f"p99 {trip['p99_us']:.1f} us (copy engines, no SMs)")
