"""examples/python/moe_layer.py: a PyTorch attention + MoE model, 2A2F and three micro-batches,
each instance a process of its own, checked against the same model computed in one process; run
as the README says, with another python3 (one without torch) first on PATH."""

import os
import subprocess

from conftest import BUILD_PYTHON, ROOT, environment

README = os.path.join(ROOT, "README.md")


def readme_command(script):
    """The README's command line that runs `script`, for this build tree instead of build/dev."""
    line = next(l for l in open(README) if script in l and not l.startswith("#"))
    command = line.split("#")[0].strip()
    assert not command.startswith("python"), "name the interpreter: " + command
    return command.replace("build/dev/python", BUILD_PYTHON)


def test_the_split_model_matches_the_single_process_reference(other_python):
    r = subprocess.run(readme_command("examples/python/moe_layer.py"), shell=True, cwd=ROOT,
                       env=environment(other_python), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified: 2 attention x 2 ffn, 3 micro-batches" in r.stdout
