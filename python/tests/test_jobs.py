"""job= names a job's rendezvous namespace: two jobs share one store, each instance meeting only
its own job's peers."""

import threading

import pytest
import torch

import hetmesh
from conftest import doubling_ffn


def test_two_jobs_with_different_names_run_at_once_on_one_store(store, job, spawn):
    jobs = {"one": 1.0, "two": 5.0}  # each job's A sends its own value
    ffns = [doubling_ffn(spawn, store, {**job, "job": name}) for name in jobs]
    results, errors = {}, []

    def attention(name, value):
        try:
            with hetmesh.AttentionEngine(rank=0, store=store.address, job=name, **job) as a:
                assert a.job == name
                torch.from_dlpack(a.tokens(0)).fill_(value)
                a.wait(a.push_pull(0))
                results[name] = torch.from_dlpack(a.result(0, 0)).float().unique().tolist()
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=attention, args=item) for item in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert results == {name: [value * 2] for name, value in jobs.items()}
    for ffn in ffns:
        code, out, err = ffn.finish()
        assert code == 0, err
        assert "served 1" in out


def test_job_is_an_engine_argument_not_a_config_setting():
    with pytest.raises(TypeError, match=r"job= is an argument of the engines"):
        hetmesh.config(attention=1, job="one")


def test_a_job_name_with_a_slash_is_refused(store, job):
    with pytest.raises(TypeError, match="without '/'"):
        hetmesh.AttentionEngine(rank=0, store=store.address, job="a/b", **job)
