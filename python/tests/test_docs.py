"""docs/python.md's complete small job runs as written: its two files, an F and an A."""

import os
import re
import subprocess
import sys

import hetmesh

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")


def test_the_small_job_of_the_python_page_runs_as_written(tmp_path):
    text = open(DOC).read()
    files = dict((name, code) for code, name in
                 re.findall(r"```python\n(# (\w+\.py)\n.*?)```", text, re.S))
    assert set(files) == {"ffn.py", "attention.py"}
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    package = os.path.dirname(os.path.dirname(hetmesh.__file__))  # as the test found it
    r = subprocess.run([sys.executable, "attention.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": package})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tensor([[3., 3.," in r.stdout and "dtype=torch.bfloat16" in r.stdout
