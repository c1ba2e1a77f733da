"""python3 -m hetmesh.plot draws what the benchmarks measured beside their same-run baselines:
a real `hetmesh bench transport` run's bandwidth curves and latency CDFs, a real
hetmesh.bench_stepmesh run's round-trip CDFs; and refuses a JSON of another shape by name."""

import json
import os
import subprocess
import sys

from hetmesh import plot


def lines(figure):
    """(label, x values, y values) of each line of the figure's axes."""
    return [(line.get_label(), list(line.get_xdata()), list(line.get_ydata()))
            for line in figure.axes[0].get_lines()]


def test_a_transport_run_is_drawn_beside_memcpy_and_one_dma(tmp_path):
    out = tmp_path / "transport.json"
    r = subprocess.run([os.environ["HETMESH_CLI"], "bench", "transport", "--transport", "ipc",
                        "--sizes", "4K", "64K", "--iterations", "30", "--json", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(out.read_text())
    drawn = plot.figures(result, str(out))
    assert sorted(drawn) == ["bandwidth", "latency-4K", "latency-64K"]
    curves = {label: (xs, ys) for label, xs, ys in lines(drawn["bandwidth"])}
    assert set(curves) == {"hetmesh ipc", "memcpy", "one DMA (plugin)"}, curves
    assert curves["hetmesh ipc"][0] == [4096, 65536]
    assert curves["memcpy"][1] == [row["memcpy_GBps"] for row in result["rows"]]
    cdfs = {label: ys for label, xs, ys in lines(drawn["latency-64K"])}
    assert set(cdfs) == {"hetmesh ipc (one way)", "memcpy", "one DMA (plugin)"}, cdfs
    for ys in cdfs.values():  # every sample once, rising to 1
        assert len(ys) == 30 and ys == sorted(ys) and ys[-1] == 1.0
    r = subprocess.run([sys.executable, "-m", "hetmesh.plot", str(out), "--out",
                        str(tmp_path / "png")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    written = r.stdout.split()
    assert len(written) == 3 and all(open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
                                     for p in written), written


def test_a_stepmesh_run_is_drawn_as_both_paths_cdfs(tmp_path):
    out = tmp_path / "stepmesh.json"
    r = subprocess.run([sys.executable, "-m", "hetmesh.bench_stepmesh", "--tokens", "4",
                        "--hidden", "64", "--iterations", "10", "--phases", "2", "--warmup", "2",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    drawn = plot.figures(json.loads(out.read_text()), str(out))
    cdfs = {label: ys for label, xs, ys in lines(drawn["round-trip"])}
    assert set(cdfs) == {"hetmesh's Python path (baseline)", "fserver_lib"}
    assert all(len(ys) == 20 and ys[-1] == 1.0 for ys in cdfs.values()), cdfs


def test_a_json_of_another_shape_is_refused_by_name(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": []}))
    r = subprocess.run([sys.executable, "-m", "hetmesh.plot", str(other), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert f"{other}: not the JSON of hetmesh bench transport" in r.stderr, r.stderr
