"""python3 -m hetmesh.bench, hetmesh.bench_vllm, hetmesh.bench_queue, hetmesh.bench_graph and
hetmesh.bench_stepmesh run their two sides and
report both with their difference (what they measure is for docs/benchmarks.md; here only that
they measure and say what they measured)."""

import json
import re
import subprocess
import sys


def test_the_benchmark_reports_both_sides_and_the_overhead(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "hetmesh.bench", "--tokens", "4", "--hidden", "64",
                        "--iterations", "20", "--phases", "2", "--warmup", "5", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Python overhead per push_pull + wait" in r.stdout
    results = json.loads(out.read_text())
    assert results["round_trips_per_side"] == 40
    for side in ("cpp_round_trip_us", "python_round_trip_us", "cpp_one_per_python_call_us"):
        assert 0 < results[side]["p50"] <= results[side]["p99"]
    assert results["python_overhead_us_p50"] == (results["python_round_trip_us"]["p50"]
                                                 - results["cpp_round_trip_us"]["p50"])
    # The overhead's two parts add up to it.
    assert abs(results["binding_calls_us_p50"] + results["interpreter_between_round_trips_us_p50"]
               - results["python_overhead_us_p50"]) < 1e-6
    assert results["run"]["hetmesh_version"].startswith("0.")


def test_the_connector_benchmark_reports_both_jobs_and_the_cost(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "hetmesh.bench_vllm", "--tokens", "4", "--hidden",
                        "64", "--iterations", "20", "--phases", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "connector cost per layer exchange" in r.stdout
    results = json.loads(out.read_text())
    assert results["exchanges_per_side"] == 40
    for side in ("bare_cpp_round_trip_us", "connector_layer_exchange_us"):
        assert 0 < results[side]["p50"] <= results[side]["p99"]
    assert results["connector_cost_us_p50"] == (results["connector_layer_exchange_us"]["p50"]
                                                - results["bare_cpp_round_trip_us"]["p50"])
    # Every exchange (the warm-up step's too) from and into the A's own tensor: 4 rows of 64
    # bf16 each way.
    assert results["connector_counters"]["caller_bytes"] == (40 + 20) * 4 * 64 * 2 * 2
    # Where the cost goes: each side's calling thread's CPU per exchange, the A's in the results,
    # each F's on its stderr over every exchange it served (the warm-up's too).
    assert all(results["calling_thread_cpu_us_per_exchange"][side] > 0
               for side in ("bare", "connector"))
    assert re.search(r"the bare F: [0-9.]+ us of its calling thread's CPU per batch \(60\)",
                     r.stderr), r.stderr
    assert re.search(r"the connector's F: [0-9.]+ us of its calling thread's CPU per layer "
                     r"\(60\)", r.stderr), r.stderr


def test_the_stepmesh_benchmark_reports_both_paths_and_the_cost(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "hetmesh.bench_stepmesh", "--tokens", "4", "--hidden",
                        "64", "--iterations", "20", "--phases", "2", "--warmup", "5", "--json",
                        str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fserver_lib's cost per round trip" in r.stdout
    results = json.loads(out.read_text())
    assert results["round_trips_per_side"] == 40
    for side in ("hetmesh_python_round_trip_us", "fserver_lib_round_trip_us"):
        assert 0 < results[side]["p50"] <= results[side]["p99"]
    assert results["fserver_lib_cost_us_p50"] == (results["fserver_lib_round_trip_us"]["p50"]
                                                  - results["hetmesh_python_round_trip_us"]["p50"])
    # Every round trip (the warm-up's too) from worker 0's own tensors: 4 x 64 bytes out to each
    # of the two servers, 4 x 64 bf16 back from each; none through hetmesh's buffers.
    counters = results["fserver_lib_counters"]
    assert counters["caller_bytes"] == (40 + 5) * 2 * (4 * 64 + 4 * 64 * 2), counters
    assert counters["slot_bytes"] == 0, counters


def test_the_queue_benchmark_reports_both_modes_with_every_answer_in_order(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "hetmesh.bench_queue", "--tokens", "4", "--hidden",
                        "64", "--layers", "8", "--iterations", "5", "--phases", "2", "--warmup",
                        "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "queued / waited per layer" in r.stdout and "answers wrong: 0" in r.stdout
    results = json.loads(out.read_text())
    assert results["stages_per_side"] == 10 and results["wrong_answers"] == 0
    assert results["job"]["queue_depth"] == 8
    for mode in ("waited_per_layer_us", "queued_per_layer_us", "pushing_all_layers_us"):
        assert 0 < results[mode]["p50"] <= results[mode]["p99"]


def test_the_graph_benchmark_reports_the_host_and_device_modes_with_every_answer_right(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "hetmesh.bench_graph", "--tokens", "4", "--hidden",
                        "64", "--layers", "4", "--iterations", "5", "--phases", "2", "--warmup",
                        "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    results = json.loads(out.read_text())
    # cpu:0 has no graphs: the host's push_pull per layer against the device's rings.
    assert set(results["modes"]) == {"host", "device"}
    for mode in results["modes"].values():
        assert mode["wrong_answers"] == 0
        assert 0 < mode["per_layer_us"]["p50"] <= mode["per_layer_us"]["p99"]
    # 4 layers x (1 warm-up + 2 x 5) steps, every one rung by the stream and answered.
    assert results["device_trips"] == {"rung": 44, "completed": 44, "failed": 0, "failures": []}
