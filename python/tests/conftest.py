"""Shared fixtures: a store per test, a small job, and instances in processes of their own."""

import os
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

import hetmesh

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
BUILD_PYTHON = os.path.dirname(os.path.dirname(hetmesh.__file__))  # <build>/python

# A job small enough for a 2-core machine: every test's engines use it unless they say otherwise.
# Its bounds are far beyond what a loaded machine takes (a peer in a process of its own imports
# torch before it joins): a test that wants a timeout sets its own.
SMALL_JOB = dict(attention=1, ffn=1, micro_batches=2, tokens=8, hidden=16, experts=2, top_k=2,
                 timeout_ms=60000, heartbeat_ms=60000)


@pytest.fixture
def store():
    server = hetmesh.StoreServer()
    yield server
    server.close()


@pytest.fixture
def job():
    return dict(SMALL_JOB)


class Instance:
    """A Python program in a process of its own (a real peer: it can be killed)."""

    def __init__(self, code: str, env=None):
        self.process = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})

    def finish(self, timeout=180):
        out, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, out, err

    def kill(self):
        self.process.kill()
        self.process.wait(timeout=30)


@pytest.fixture
def spawn():
    started = []

    def start(code, env=None):
        instance = Instance(code, env)
        started.append(instance)
        return instance

    yield start
    for instance in started:
        if instance.process.poll() is None:
            instance.kill()


# An FFN instance that doubles every token (as float) into its output, for the given job.
DOUBLING_FFN = """
import sys, torch, hetmesh
job = {job!r}
f = hetmesh.FfnEngine(rank={rank}, store={store!r}, **job)
served = 0
for batch in f.batches():
    for part in batch.parts:
        tokens = torch.from_dlpack(part.tokens)
        torch.from_dlpack(part.output)[:] = (tokens.float() * 2 + part.rank).to(torch.bfloat16)
    f.respond(batch)
    served += 1
print("served", served, flush=True)
"""


def doubling_ffn(spawn, store, job, rank=0):
    return spawn(DOUBLING_FFN.format(job=job, rank=rank, store=store.address))


# Threads serve() started; each test's end joins them, so no engine thread is still in native
# code when the interpreter finalizes (a daemon thread that was once made it abort now and then).
_served: list[threading.Thread] = []


def serve(store, job, rank=0):
    """An FFN instance in a thread of this process that answers every batch as it came (the
    engines release the GIL while they wait); returns the thread, which the test's end joins."""

    def run():
        with hetmesh.FfnEngine(rank=rank, store=store.address, **job) as f:
            for batch in f.batches():
                f.respond(batch)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    _served.append(thread)
    return thread


@pytest.fixture(autouse=True)
def _join_served_ffns():
    yield
    while _served:
        thread = _served.pop()
        thread.join(timeout=120)
        assert not thread.is_alive(), "an FFN thread of serve() did not end within 120 s"


@pytest.fixture(scope="session")
def other_python(tmp_path_factory):
    """A folder whose python3 is another interpreter (a copy of this one's binary, so not the one
    hetmesh was built for) without site-packages, so without torch."""
    folder = tmp_path_factory.mktemp("other-python")
    binary = folder / "python3.bin"
    shutil.copy(os.path.realpath(sys.executable), binary)
    script = folder / "python3"
    script.write_text(f'#!/bin/sh\nPYTHONHOME={sys.base_prefix} exec {binary} -S "$@"\n')
    script.chmod(0o755)
    return folder


def environment(other_python, **extra):
    return {**os.environ, "PATH": f"{other_python}:{os.environ['PATH']}", **extra}
