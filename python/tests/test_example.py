"""examples/python/moe_layer.py: a PyTorch attention + MoE model, 2A2F and three micro-batches,
each instance a process of its own, checked against the same model computed in one process; run
as the README says, with another python3 (one without torch) first on PATH; and started by
torchrun and by mpirun, a process an instance."""

import os
import subprocess
import sys

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


def launched(command: list[str], timeout: int = 240) -> str:
    """`command` run with the package on the path; its output, once it succeeded."""
    env = {**os.environ, "PYTHONPATH": BUILD_PYTHON, "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    r = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def port() -> str:
    from hetmesh.bench import free_port
    return str(free_port())


# The same example started by real launchers, a process an instance (hetmesh.launched): each A
# checks its own final hidden states.
def test_torchrun_starts_the_example_as_four_instances(tmp_path):
    out = launched(["torchrun", "--nproc_per_node", "4", "--master_port", port(),
                    # Debian's torchrun (torch 1.13) fails with its defaults on Python 3.11
                    "--redirects", "2", "--tee", "1", "--log_dir", str(tmp_path),
                    "examples/python/moe_layer.py", "--launched"])
    for rank in range(2):
        assert f"verified: attention {rank} of 2 x 2 ffn (torchrun process {rank})" in out, out


def test_mpirun_starts_the_example_as_four_instances():
    out = launched(["mpirun", "-n", "4", "--oversubscribe", "-x", "MASTER_ADDR=127.0.0.1", "-x",
                    f"MASTER_PORT={port()}", "-x", "PYTHONPATH", sys.executable,
                    "examples/python/moe_layer.py", "--launched"])
    for rank in range(2):
        assert f"verified: attention {rank} of 2 x 2 ffn (openmpi process {rank})" in out, out
