"""python3 -m hetmesh.bench runs its two sides and reports both with their difference (what it
measures is for docs/benchmarks.md; here only that it measures and says what it measured)."""

import json
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
