"""examples/python/moe_layer.py: a PyTorch attention + MoE model, 2A2F and three micro-batches,
each instance a process of its own, checked against the same model computed in one process."""

import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python", "moe_layer.py")


def run(*args):
    return subprocess.run([sys.executable, EXAMPLE, *args], capture_output=True, text=True,
                          timeout=300)


def test_the_split_model_matches_the_single_process_reference():
    r = run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified: 2 attention x 2 ffn, 3 micro-batches" in r.stdout
