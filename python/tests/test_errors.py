"""Failures reach Python as hetmesh.Error subclasses carrying the status and the peer, within the
timeout asked for, and never take the interpreter down: a silent FFN, a killed one, a stranger
without the job's secret, an engine used after finish()."""

import os
import threading
import time

import pytest
import torch

import hetmesh
from conftest import DOUBLING_FFN, serve


def test_a_wait_that_times_out_names_the_ffn_that_did_not_answer(store, job, spawn):
    silent = spawn(f"""
import time, hetmesh
f = hetmesh.FfnEngine(rank=0, store={store.address!r}, **{job!r})
batch = f.get_batch()
print("got it", flush=True)
time.sleep(60)  # never responds
""")
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    handle = a.push_pull(0)
    started = time.monotonic()
    with pytest.raises(hetmesh.TimeoutError) as caught:
        a.wait(handle, timeout_ms=300)
    assert time.monotonic() - started < 30  # the 300 ms asked for, not the job's 60 s
    assert caught.value.peer == "ffn:0"
    assert caught.value.status_name == "HM_ERR_TIMEOUT"
    assert "no answer from ffn 0 within 300 ms" in str(caught.value)
    assert isinstance(caught.value, TimeoutError)  # the builtin, too
    silent.kill()


def test_an_ffn_killed_mid_job_is_a_peer_lost_naming_it(store, job, spawn):
    ffn = spawn(DOUBLING_FFN.format(job=job, rank=0, store=store.address))
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    a.wait(a.push_pull(0))  # the job works
    ffn.kill()
    started = time.monotonic()
    with pytest.raises(hetmesh.PeerLostError) as caught:
        while time.monotonic() - started < 60:  # the push that finds it gone, or its wait
            a.wait(a.push_pull(1), timeout_ms=30000)
    assert caught.value.peer == "ffn:0"
    assert isinstance(caught.value, ConnectionError)
    assert [p["state"] for p in a.peers()] == ["lost"]
    assert not a.wait_for_peers(timeout_ms=100)  # no replacement is coming
    a.close()  # an engine that failed closes without raising its failure again
    assert a.closed


def test_get_batch_times_out_when_no_attention_instance_sends(store, job, spawn):
    attention = spawn(f"""
import time, hetmesh
a = hetmesh.AttentionEngine(rank=0, store={store.address!r}, **{job!r})
time.sleep(600)  # silent until killed
""")
    f = hetmesh.FfnEngine(rank=0, store=store.address, **job)
    with pytest.raises(hetmesh.TimeoutError, match="within 200 ms"):
        f.get_batch(timeout_ms=200)
    attention.kill()


def test_a_process_without_the_jobs_secret_is_refused(tmp_path, job):
    secret = tmp_path / "job.secret"
    hetmesh.write_secret(secret)
    assert oct(os.stat(secret).st_mode & 0o777) == "0o600"
    server = hetmesh.StoreServer(secret_file=str(secret))
    other = tmp_path / "other.secret"
    hetmesh.write_secret(other)
    with pytest.raises(hetmesh.NotAuthorizedError) as caught:
        hetmesh.FfnEngine(rank=0, store=server.address, secret_file=other, **job)
    assert isinstance(caught.value, PermissionError)
    server.close()


def test_a_job_whose_peers_never_come_times_out_in_the_constructor(store, job):
    job["timeout_ms"] = 300
    started = time.monotonic()
    with pytest.raises(hetmesh.TimeoutError, match="within 300 ms"):
        hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    assert time.monotonic() - started < 30  # the 300 ms asked for, not the job's 60 s


def test_the_gil_is_free_while_an_engine_waits(store, job):
    job["timeout_ms"] = 8000
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    thread = threading.Thread(target=tick)
    thread.start()
    started = time.monotonic()
    with pytest.raises(hetmesh.TimeoutError):
        hetmesh.AttentionEngine(rank=0, store=store.address, **job)  # waits 8 s for its F
    ended = time.monotonic()
    stop.set()
    thread.join()
    during = [t for t in ticks if started <= t <= ended]
    gaps = [b - a for a, b in zip(during, during[1:])]
    assert ended - started >= 7.9 and len(during) > 2
    # Held through the wait, the GIL would stop the other thread for the whole 8 s; a loaded
    # machine may stop it for a while, never for half of that.
    assert max(gaps) < 4, f"the other thread stood still for {max(gaps):.2f} s"


def test_an_engine_used_after_finish_says_so(store, job):
    serve(store, job)
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    a.finish()
    with pytest.raises(hetmesh.ClosedError, match="push_pull after finish"):
        a.push_pull(0)


def test_a_push_beyond_a_full_queue_is_refused(store, job, spawn):
    job["queue_depth"] = 2
    ffn = spawn(DOUBLING_FFN.format(job=job, rank=0, store=store.address))
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    handles = [a.push_pull(0), a.push_pull(0)]  # the second queues behind the first
    with pytest.raises(hetmesh.InvalidArgumentError,
                       match=r"micro-batch 0 has 2 round trip\(s\) in flight.*queue_depth"):
        a.push_pull(0)
    for handle in handles:
        a.wait(handle)
    a.finish()
    assert ffn.finish()[0] == 0


def test_a_store_nobody_serves_fails_the_engine_clearly(job):
    job["timeout_ms"] = 500
    with pytest.raises(hetmesh.Error, match="127.0.0.1:1"):  # nothing listens on port 1
        hetmesh.FfnEngine(rank=0, store="127.0.0.1:1", **job)


def test_a_closed_store_says_so(job):
    server = hetmesh.StoreServer()
    server.close()
    server.close()  # twice is harmless
    with pytest.raises(hetmesh.InvalidArgumentError, match="closed"):
        server.address


def test_timeouts_must_be_durations(store, job):
    serve(store, job)
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    handle = a.push_pull(0)
    for bad in (-1, float("nan")):
        with pytest.raises(hetmesh.InvalidArgumentError, match="timeout_ms"):
            a.wait(handle, timeout_ms=bad)
    a.wait(handle, timeout_ms=float("inf"))  # forever is a duration
    a.finish()


def test_a_stream_that_is_not_the_engines_is_refused_with_what_to_do(store, job):
    serve(store, job)
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    with pytest.raises(hetmesh.InvalidArgumentError, match=r"expected a hetmesh.Stream .*a "
                                                           r"framework's CUDA stream .*got a object"):
        a.push_pull(0, stream=object())
    with pytest.raises(hetmesh.NotSupportedError, match=r"cpu:0's plugin cannot take a "
                                                        r"framework's stream"):
        a.push_pull(0, stream=1234)  # a raw handle: only a plugin with stream_borrow takes one
    a.wait(a.push_pull(0, stream=a.create_stream()))  # the engine's own: accepted
    a.finish()
