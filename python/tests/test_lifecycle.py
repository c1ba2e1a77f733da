"""Engines made and dropped again and again leave nothing behind: no thread, no descriptor, no
growing memory; and an interpreter that exits with engines alive exits cleanly."""

import gc
import os
import threading

import torch

import hetmesh
from conftest import DOUBLING_FFN, serve


def threads_of_this_process():
    return len(os.listdir("/proc/self/task"))


def descriptors_of_this_process():
    return len(os.listdir("/proc/self/fd"))


def resident_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def one_job(job):
    store = hetmesh.StoreServer()  # a job of its own each time (the job id is the same)
    ffn = serve(store, job)
    a = hetmesh.AttentionEngine(rank=0, store=store.address, **job)
    tokens = torch.from_dlpack(a.tokens(0))
    tokens.fill_(1)  # touched: a leaked slot would count in the resident memory
    a.wait(a.push_pull(0))
    a.finish()
    del a, tokens
    ffn.join(30)
    assert not ffn.is_alive()
    store.close()


def test_engines_made_and_dropped_in_a_loop_leave_nothing_behind(job):
    job["hidden"] = 32768  # slots of 256 KiB and more (about 2.5 MiB a job): a leak would show
    one_job(job)  # the first builds what stays for the process (plugins, the loader)
    gc.collect()
    threads, descriptors, resident = (threads_of_this_process(), descriptors_of_this_process(),
                                      resident_kib())
    for _ in range(20):
        one_job(job)
    gc.collect()
    assert threads_of_this_process() == threads
    assert descriptors_of_this_process() == descriptors
    assert resident_kib() - resident < 8 * 1024  # 20 jobs' slots would be about 50 MiB


def test_an_interpreter_that_exits_with_engines_alive_exits_cleanly(store, job, spawn):
    ffn = spawn(DOUBLING_FFN.format(job=job, rank=0, store=store.address))
    attention = spawn(f"""
import torch, hetmesh
a = hetmesh.AttentionEngine(rank=0, store={store.address!r}, **{job!r})
kept = torch.from_dlpack(a.tokens(0))   # a tensor still holding the engine at exit
a.wait(a.push_pull(0))
print("done", flush=True)
# no finish(): the engine goes at exit, and the FFN hears that this A quit
""")
    code, out, err = attention.finish()
    assert code == 0, err
    assert "done" in out
    code, out, err = ffn.finish()
    # The FFN hears that its only A quit without finish(), and says so (it does not hang).
    assert code != 0
    assert "attention 0 quit" in err, err
