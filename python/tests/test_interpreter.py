"""Another python3 first on PATH: the README's and docs' commands still run (they name the
interpreter the package was built for, through hetmesh-python), and a program run by an
interpreter without torch, or one the native module is not for, hears which one hetmesh is for."""

import os
import shutil
import subprocess
import sysconfig

import hetmesh

from conftest import BUILD_PYTHON, ROOT, environment

LAUNCHER = os.path.join(BUILD_PYTHON, "hetmesh-python")


def run(command, env, cwd=ROOT, timeout=60):
    return subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_fake_python3_is_first_and_has_no_torch(other_python):
    r = run("python3 -c 'import torch'", environment(other_python))
    assert r.returncode != 0 and "No module named 'torch'" in r.stderr


def test_the_launcher_runs_the_built_for_interpreter_whatever_is_on_path(other_python):
    r = run(f"{LAUNCHER} -c 'import sys, torch, hetmesh; print(sys.executable, hetmesh.BUILT_FOR)'",
            environment(other_python))
    assert r.returncode == 0, r.stderr
    executable, built_for = r.stdout.split()
    assert os.path.realpath(executable) == os.path.realpath(built_for)


def test_a_program_run_by_an_interpreter_without_torch_hears_which_one_to_use(other_python):
    r = run("python3 examples/python/moe_layer.py",
            environment(other_python, PYTHONPATH=BUILD_PYTHON))
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "torch" in r.stderr
    assert f"hetmesh was built for {hetmesh.BUILT_FOR}" in r.stderr, r.stderr
    assert LAUNCHER in r.stderr or os.path.normpath(LAUNCHER) in r.stderr


def test_a_native_module_for_another_python_is_named(other_python, tmp_path):
    package = tmp_path / "hetmesh"
    shutil.copytree(os.path.dirname(hetmesh.__file__), package)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    (package / f"_native{suffix}").rename(package / "_native.cpython-399-x86_64-linux-gnu.so")
    r = run("python3 -c 'import hetmesh'", environment(other_python, PYTHONPATH=str(tmp_path)))
    assert r.returncode != 0
    assert "hetmesh's native module does not load here" in r.stderr, r.stderr
    assert f"hetmesh was built for {hetmesh.BUILT_FOR}" in r.stderr
    assert "-DHETMESH_PYTHON=" in r.stderr
