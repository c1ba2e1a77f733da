"""StepMesh's `fserver_lib` on hetmesh: versions of StepMesh's own Python tests
(tests/fserver/test_fserver*.py), each role a process of its own started with StepMesh's
variables, as its run_single_gpu.sh and run_multi_gpu.sh start them. On CPU tensors in the test
command; ci/gpu/stepmesh.sh runs them with CUDA tensors (HM_TEST_STEPMESH_DEVICE=cuda), every
instance on cuda:0."""

import os
import subprocess
import sys
import textwrap

from hetmesh.bench import free_port


CUDA = os.environ.get("HM_TEST_STEPMESH_DEVICE") == "cuda"
# The package's folder, where fserver_lib.py lies beside hetmesh/ (what PYTHONPATH names).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__import__("hetmesh").__file__)))


class Job:
    """A scheduler, servers and workers of one StepMesh job, each running `script`."""

    def __init__(self, script: str, workers=1, servers=1, group_size=1, **extra):
        self.env = {**os.environ, "PYTHONPATH": PACKAGE_PARENT, "DMLC_NUM_WORKER": str(workers),
                    "DMLC_NUM_SERVER": str(servers), "DMLC_GROUP_SIZE": str(group_size),
                    "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(free_port()),
                    "HETMESH_STEPMESH_MAX_BYTES": str(64 << 10),
                    "HETMESH_STEPMESH_DEVICE": "cuda:0" if CUDA else "cpu:0",
                    "STEPMESH_BIND_CPU_CORE": "1", **extra}
        self.script = textwrap.dedent(script)
        self.processes = {}
        self.start("scheduler")
        for node in range(servers):
            for gpu in range(group_size):
                self.start(f"server{node}.{gpu}", DMLC_ROLE="server", DMLC_NODE_RANK=node,
                           STEPMESH_GPU=gpu)
        for node in range(workers):
            for gpu in range(group_size):
                self.start(f"worker{node}.{gpu}", DMLC_ROLE="worker", DMLC_NODE_RANK=node,
                           STEPMESH_GPU=gpu)

    def start(self, name, **env):
        env = {**self.env, "DMLC_ROLE": "scheduler", **{k: str(v) for k, v in env.items()}}
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-c", self.script], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)

    def finish(self, timeout=240):
        """Each process's (exit code, stdout, stderr); the scheduler's last (it stops once every
        other process has stopped, and waits for ever if one died)."""
        results = {}
        try:
            for name, p in sorted(self.processes.items(), key=lambda item: item[0] == "scheduler"):
                limit = timeout if name != "scheduler" else 30
                try:
                    out, err = p.communicate(timeout=limit)
                except subprocess.TimeoutExpired:
                    p.kill()
                    out, err = p.communicate()
                    err += f"\n(killed: still running after {limit} s)"
                results[name] = (p.returncode, out, err)
        finally:
            for p in self.processes.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return results


def assert_all_passed(results):
    for name, (code, out, err) in results.items():
        assert code == 0, f"{name} exited {code}:\n{out}\n{err}"


# StepMesh's test_fserver.py on CPU tensors: three tensors pushed, their sum pulled.
SUM = """
import torch, os, time
import fserver_lib as f
dev = 'cuda:0' if os.environ.get('HM_TEST_STEPMESH_DEVICE') == 'cuda' else 'cpu'
is_worker = os.environ.get('DMLC_ROLE') == 'worker'
is_server = os.environ.get('DMLC_ROLE') == 'server'
f.init()
if is_worker:
    push_tensors = [torch.rand([1, 8192], dtype=torch.float32, device=dev) for _ in range(3)]
    pull_tensors = [torch.rand([1, 8192], dtype=torch.float32, device=dev)]
    handler = f.push_pull(push_tensors, [i for i in range(len(push_tensors))], pull_tensors,
                          [i for i in range(len(pull_tensors))])
    f.wait(handler)
    assert torch.allclose(sum(push_tensors), pull_tensors[0])
    print("worker test done")
elif is_server:
    res = []
    while len(res) == 0:
        time.sleep(0.1)
        res = f.get_batch()
    for comm_id, batch, keys in res:
        assert keys == [0, 1, 2], keys
        assert [t.shape for t in batch] == [torch.Size([1, 8192])] * 3, batch
        f.respond([sum(batch)], comm_id)
f.stop()
"""


def test_a_worker_pushes_three_tensors_and_pulls_their_sum():
    results = Job(SUM).finish()
    assert_all_passed(results)
    assert "worker test done" in results["worker0.0"][1]


# StepMesh's test_fserver_dynamic.py on CPU tensors: three stages, a new number of rows every
# call, each server echoing every worker's tensor into that worker's pull tensor for it; plus
# what StepMesh's test prints and does not check: the keys, the bytes, and that nothing was copied.
DYNAMIC = """
import torch, os, random
import fserver_lib as f
dev = 'cuda:0' if os.environ.get('HM_TEST_STEPMESH_DEVICE') == 'cuda' else 'cpu'
import hetmesh.stepmesh
is_worker = os.environ.get('DMLC_ROLE') == 'worker'
is_server = os.environ.get('DMLC_ROLE') == 'server'
server_count = int(os.environ.get('DMLC_NUM_SERVER', '1'))
worker_count = int(os.environ.get('DMLC_NUM_WORKER', '1'))
rank = int(os.environ.get('DMLC_NODE_RANK', '0'))
iter_count, max_num_tokens, hidden = 40, 16, 1024
f.init()
if is_worker:
    f.barrier(False, True)
    recv_buffer = [[torch.empty((max_num_tokens, hidden), dtype=torch.bfloat16, device=dev)
                    for _ in range(server_count)] for _ in range(3)]
    send_buffer = [torch.empty((max_num_tokens, hidden), dtype=torch.bfloat16, device=dev)
                   for _ in range(3)]
    scales = [torch.empty(max_num_tokens, dtype=torch.float32, device=dev) for _ in range(3)]
    random.seed(rank)
    for i in range(iter_count):
        for stage in range(3):
            width = max_num_tokens if i == 0 else random.randint(1, max_num_tokens)
            push = [send_buffer[stage][:width], scales[stage][:width]]
            push[0].copy_(torch.rand([width, hidden]) + rank)
            push[1].copy_(torch.arange(width) * (stage + 1))
            pull = [recv_buffer[stage][s][:width] for s in range(server_count)]
            handler = f.push_pull(push, [stage + rank * 1000, 99], pull,
                                  [1000 + stage + s for s in range(server_count)])
            assert len(f.get_all_handlers(handler)) == 3
            f.wait(handler, 1000 * 60)
            for s in range(server_count):
                assert torch.equal(pull[s], push[0]), (i, stage, s)
            trace = f.fetch_trace(handler)
            assert len(trace) == 8 and trace[0] <= trace[1] <= trace[6] <= trace[7], trace
            assert trace[2] <= trace[3] <= trace[4] <= trace[5], trace
    counters = hetmesh.stepmesh._state["worker"].engine.counters()
    assert counters["slot_bytes"] == 0 and counters["caller_bytes"] > 0, counters
    print("worker test done", counters)
    f.stop()
elif is_server:
    f.barrier(True, False)
    for i in range(iter_count * 3):
        batches = f.get_batch()
        assert len(batches) == worker_count, batches
        for j in range(worker_count):
            handler, tensors, keys = batches[j]
            stage = i % 3
            assert keys == [stage + j * 1000, 99], (i, j, keys)
            assert tensors[0].dtype == torch.bfloat16 and tensors[0].shape[1] == hidden
            assert tensors[1].dtype == torch.float32 and tensors[1].dim() == 1
            assert torch.equal(tensors[1].cpu(), torch.arange(tensors[1].shape[0]) * (stage + 1.0))
            assert (tensors[0].float() >= j).all() and (tensors[0].float() <= j + 1).all()
        # Answered in reverse order: any handler, any order.
        for j in reversed(range(worker_count)):
            f.respond([batches[j][1][0]], batches[j][0], need_event=True)
    print("server test done")
    f.stop()
else:
    f.stop()
"""


def test_shapes_that_change_every_call_keys_and_stages_from_two_workers_to_two_servers():
    results = Job(DYNAMIC, workers=2, servers=2).finish()
    assert_all_passed(results)
    for name in ("worker0.0", "worker1.0"):
        assert "worker test done" in results[name][1], results[name]
    for name in ("server0.0", "server1.0"):
        assert "server test done" in results[name][1], results[name]


# Rails (DMLC_GROUP_SIZE 2): worker instance i talks to server instance i alone. Both push and
# respond from temporaries they drop at once: the shim holds them until the engine is done.
RAILS = """
import torch, os
import fserver_lib as f
dev = 'cuda:0' if os.environ.get('HM_TEST_STEPMESH_DEVICE') == 'cuda' else 'cpu'
gpu = int(os.environ.get('STEPMESH_GPU', '0'))
f.init()
if os.environ['DMLC_ROLE'] == 'worker':
    x = torch.full((4, 8), float(gpu), device=dev)
    y = torch.zeros(4, 8, device=dev)
    for _ in range(5):
        f.wait(f.push_pull([x * 1], [gpu], [y], [gpu]))
        assert torch.equal(y, x * 10 + gpu), y
    print("worker test done")
elif os.environ['DMLC_ROLE'] == 'server':
    for _ in range(5):
        (handler, tensors, keys), = f.get_batch()
        assert keys == [gpu] and torch.equal(tensors[0].cpu(), torch.full((4, 8), float(gpu)))
        f.respond([tensors[0] * 10 + gpu], handler)
f.stop()
"""


def test_instance_i_of_a_worker_node_talks_to_instance_i_of_each_server_node():
    results = Job(RAILS, workers=1, servers=1, group_size=2).finish()
    assert_all_passed(results)


# A server killed mid-run: the worker's wait raises PeerLostError naming it (StepMesh aborts).
KILLED = """
import torch, os, signal
import fserver_lib as f
dev = 'cuda:0' if os.environ.get('HM_TEST_STEPMESH_DEVICE') == 'cuda' else 'cpu'
import hetmesh
f.init()
if os.environ['DMLC_ROLE'] == 'worker':
    x, y0, y1 = (torch.ones(4, 8, device=dev), torch.zeros(4, 8, device=dev),
                 torch.zeros(4, 8, device=dev))
    for step in range(1000):
        try:
            f.wait(f.push_pull([x], [0], [y0, y1], [1, 2]), 30000)
        except hetmesh.PeerLostError as error:
            print("lost at step", step, ":", error, flush=True)
            break
    else:
        raise SystemExit("no server was lost")
elif os.environ['DMLC_ROLE'] == 'server':
    rank = int(os.environ['DMLC_NODE_RANK'])
    for step in range(1000):
        batches = f.get_batch()
        if not batches:
            break  # the worker is gone
        (handler, tensors, keys), = batches
        if rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        f.respond([tensors[0]], handler)
else:
    f.stop()  # the store stays up while the job runs
"""


def test_a_server_killed_mid_run_is_an_error_naming_it_in_the_worker():
    job = Job(KILLED, workers=1, servers=2)
    worker = job.processes["worker0.0"]
    out, err = worker.communicate(timeout=120)
    for p in job.processes.values():
        if p.poll() is None:
            p.kill()
            p.wait()
    assert worker.returncode == 0, err
    assert "lost at step 3" in out and "ffn 1" in out, out


# What StepMesh aborted on or did silently, refused by name, each leaving the job usable: a 0-d
# tensor travels; a push past HETMESH_STEPMESH_MAX_BYTES is refused and the next pairs right; a
# push_pull past MICRO_BATCHES in flight is refused; a respond of the wrong size is refused and
# the handler can be answered again.
REFUSALS = """
import torch, os
import fserver_lib as f
import hetmesh
dev = 'cuda:0' if os.environ.get('HM_TEST_STEPMESH_DEVICE') == 'cuda' else 'cpu'
f.init()
if os.environ['DMLC_ROLE'] == 'worker':
    x, y = torch.full((4, 8), 2.0, device=dev), torch.zeros(4, 8, device=dev)
    f.wait(f.push_pull([torch.tensor(3.0, device=dev), x], [7, 8], [y], [9]))
    assert torch.equal(y, x * 3), y
    big = torch.zeros(64 * 1024 + 1, dtype=torch.uint8, device=dev)
    try:
        f.push_pull([big], [1], [y], [9])
        raise SystemExit("a push past the job's bytes was taken")
    except hetmesh.InvalidArgumentError as error:
        assert "HETMESH_STEPMESH_MAX_BYTES" in str(error), error
    handlers = [f.push_pull([x * (i + 1)], [i], [y[i:i + 1]], [9]) for i in range(3)]
    try:
        f.push_pull([x], [3], [y], [9])
        raise SystemExit("a fourth push_pull in flight was taken")
    except hetmesh.InvalidArgumentError as error:
        assert "in flight" in str(error), error
    for h in handlers:
        f.wait(h)
    print("worker test done", flush=True)
elif os.environ['DMLC_ROLE'] == 'server':
    (handler, tensors, keys), = f.get_batch()
    assert keys == [7, 8] and tensors[0].dim() == 0 and tensors[0].item() == 3.0, tensors
    try:
        f.respond([tensors[1][:2]], handler)
        raise SystemExit("a respond of the wrong size was taken")
    except hetmesh.InvalidArgumentError as error:
        assert "pull tensor of 128 bytes" in str(error), error
    f.respond([tensors[1] * tensors[0]], handler)
    for i in range(3):  # the pushes after the refused one, paired from the first
        (handler, tensors, keys), = f.get_batch()
        assert keys == [i] and torch.equal(tensors[0].cpu(), torch.full((4, 8), 2.0 * (i + 1)))
        f.respond([tensors[0][:1]], handler)
    print("server test done", flush=True)
f.stop()
"""


def test_what_stepmesh_aborted_on_is_refused_by_name_and_the_job_goes_on():
    results = Job(REFUSALS).finish()
    assert_all_passed(results)
    assert "worker test done" in results["worker0.0"][1]
    assert "server test done" in results["server0.0"][1]


# StepMesh's stream helpers: SimpleNotify on both sides, and test_kernel_wait.py's pattern (the
# stream rings the host with write_flag, a host thread does the push_pull and acks, the stream
# waits with wait_flag). With CUDA, the rings are captured in a graph replayed twice (the second
# replay counts on from the first, as StepMesh's wait kernel does); on the host, each call acts at
# once. A handler that is no push_pull is raised by wait_event_done, and the stream goes on.
HELPERS = """
import threading, torch, os
import fserver_lib as f
import hetmesh
cuda = os.environ.get('HM_TEST_STEPMESH_DEVICE') == 'cuda'
dev = 'cuda:0' if cuda else 'cpu'
ROUNDS, LAYERS = 5, 6
f.init()
if os.environ['DMLC_ROLE'] == 'worker':
    n = f.SimpleNotify()
    n.init()
    x, y = torch.arange(8.0, device=dev).view(2, 4), torch.zeros(2, 4, device=dev)
    for r in range(ROUNDS):
        n.stream_wait_event(f.push_pull([x + r], [0], [y], [1]))
        z = y * 2  # on the stream, after the results are in: no host wait before it
        n.wait_event_done()
        assert torch.equal(z, (x + r) * 2), (r, z)
    n.stream_wait_event(12345)
    try:
        n.wait_event_done()
        raise SystemExit("a handler that is no push_pull was not raised")
    except hetmesh.InvalidArgumentError as error:
        assert "12345" in str(error), error
    assert torch.equal(y + 0, (x + ROUNDS - 1)), y  # the stream was let go

    signal = torch.zeros(1, dtype=torch.int64, pin_memory=cuda)
    ack = torch.zeros(1, dtype=torch.int64, pin_memory=cuda)
    signal_dev, ack_dev = f.map_pinned_tensor(signal, 0), f.map_pinned_tensor(ack, 0)
    seq = torch.zeros(1, dtype=torch.int64, device=dev)
    answered, stop = [], threading.Event()

    def handle():  # the host's side: each ring is a round trip
        expected = 1
        while not stop.is_set():
            if int(signal[0]) < expected:
                continue
            f.wait(f.push_pull([x * expected], [0], [y], [1]))
            answered.append(float(y[0, 1]))
            ack.fill_(expected)
            expected += 1

    thread = threading.Thread(target=handle)
    thread.start()

    def step():
        for _ in range(LAYERS):
            f.seq_add_one(seq)
            f.write_flag(signal_dev, seq)
            f.wait_flag(ack_dev, seq)

    if cuda:
        try:
            f.wait_flag(torch.zeros(1, dtype=torch.int64, device=dev), seq)
            raise SystemExit("a flag the host cannot read was taken")
        except hetmesh.NotSupportedError as error:
            assert "map_pinned_tensor" in str(error), error
        try:
            f.write_flag(torch.zeros(1, dtype=torch.int64), seq)
            raise SystemExit("a flag in pageable host memory was taken")
        except hetmesh.InvalidArgumentError as error:
            assert "map_pinned_tensor" in str(error), error
        s = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            graph.capture_begin()
            step()
            graph.capture_end()
        for _ in range(2):
            graph.replay()
        torch.cuda.synchronize()
    else:
        step()
        step()
    stop.set()
    thread.join()
    assert answered == [float(i) for i in range(1, 2 * LAYERS + 1)], answered
    assert int(seq[0]) == 2 * LAYERS and int(signal[0]) == 2 * LAYERS, (seq, signal)
    print("worker test done", flush=True)
elif os.environ['DMLC_ROLE'] == 'server':
    n = f.SimpleNotify()
    n.init()
    for r in range(ROUNDS + 2 * LAYERS):
        n.block_now_stream_and_get_batch()
        (handler, tensors, keys), = n.get_future_batch_data()
        f.respond([tensors[0] + 0], handler)
    print("server test done", flush=True)
f.stop()
"""


def test_stream_helpers_hold_the_stream_until_the_host_says_so():
    results = Job(HELPERS).finish()
    assert_all_passed(results)
    assert "worker test done" in results["worker0.0"][1]
    assert "server test done" in results["server0.0"][1]


# A worker's side band is input to the server like any other: layouts that are not JSON, not of
# the shape, past the job's tensors or of a dtype torch lacks are dropped naming the worker, and
# the pushes after them are served right.
HOSTILE_LAYOUTS = """
import torch, os
import fserver_lib as f
import hetmesh.stepmesh, json
dev = 'cuda:0' if os.environ.get('HM_TEST_STEPMESH_DEVICE') == 'cuda' else 'cpu'
f.init()
if os.environ['DMLC_ROLE'] == 'worker':
    engine = hetmesh.stepmesh._state['worker'].engine
    for bad in [b'{not json', b'[0, []]', b'[2, [[1, "float32", [4], 2]]]',
                json.dumps([3, [[1, "float32", [4], 2, -1]] * 9]).encode(), b'[' * 50000,
                b'[4, [[1, "float128", [4], 2, -1]]]',
                b'[5, [[1, "float32", [-4], 2, -1]]]', b'[6, [[true, "float32", [4], 2, -1]]]']:
        engine.send_message(0, hetmesh.stepmesh._LAYOUT + bad)
    x, y = torch.arange(8.0, device=dev).view(2, 4), torch.zeros(2, 4, device=dev)
    f.wait(f.push_pull([x], [0], [y], [1]))
    assert torch.equal(y, x + 1), y
    print("worker test done", flush=True)
elif os.environ['DMLC_ROLE'] == 'server':
    (handler, tensors, keys), = f.get_batch()
    f.respond([tensors[0] + 1], handler)
    print("server test done", flush=True)
f.stop()
"""


def test_malformed_layouts_from_a_worker_are_dropped_naming_it():
    results = Job(HOSTILE_LAYOUTS).finish()
    assert_all_passed(results)
    err = results["server0.0"][2]
    assert err.count("attention 0 said a layout that") == 8, err
    for why in ["is not [number, entries] JSON", "has no number >= 1", "malformed entry",
                "at most 4 entries", "float128"]:
        assert why in err, (why, err)


# A worker that pushes under a layout it never said costs the other worker nothing: the server
# hands out the good part only, naming the bad worker in its log, and that worker's wait times out.
BAD_PUSH = """
import torch, os
import fserver_lib as f
import hetmesh, hetmesh.stepmesh
dev = 'cuda:0' if os.environ.get('HM_TEST_STEPMESH_DEVICE') == 'cuda' else 'cpu'
f.init()
if os.environ['DMLC_ROLE'] == 'worker':
    x, y = torch.arange(8.0, device=dev).view(2, 4), torch.zeros(2, 4, device=dev)
    if os.environ['DMLC_NODE_RANK'] == '0':
        hetmesh.stepmesh._state['worker'].layout_number = lambda layout: 999
        try:
            f.wait(f.push_pull([x], [0], [y], [1]), 3000)
            raise SystemExit("a push under a layout never said was answered")
        except hetmesh.TimeoutError as error:
            print("worker 0 timed out:", error, flush=True)
    else:
        f.wait(f.push_pull([x], [0], [y], [1]))
        assert torch.equal(y, x + 1), y
    print("worker test done", flush=True)
elif os.environ['DMLC_ROLE'] == 'server':
    batch = f.get_batch()
    assert len(batch) == 1, batch
    (handler, tensors, keys), = batch
    f.respond([tensors[0] + 1], handler)
    print("server test done", flush=True)
f.stop()
"""


def test_a_push_under_a_layout_never_said_is_not_handed_out_and_the_others_are_served():
    results = Job(BAD_PUSH, workers=2).finish()
    assert_all_passed(results)
    assert "worker test done" in results["worker1.0"][1]
    assert "worker 0 timed out" in results["worker0.0"][1]
    assert "server test done" in results["server0.0"][1]
    err = results["server0.0"][2]
    assert "attention 0 pushed layout 999, which it never said" in err, err
    assert "its part is not handed out" in err, err



# Tensors at a new address every call (kept alive, so torch cannot hand an address out again):
# the first HETMESH_STEPMESH_MAX_BUFFERS allocations of each direction are registered and used in
# place, the later ones copied through hetmesh's slots, said once each, and every answer is right.
FRESH = """
import torch, os
import fserver_lib as f
import hetmesh.stepmesh
dev = 'cuda:0' if os.environ.get('HM_TEST_STEPMESH_DEVICE') == 'cuda' else 'cpu'
f.init()
kept = []
if os.environ['DMLC_ROLE'] == 'worker':
    for i in range(6):
        x, y = torch.full((4, 2048), float(i), device=dev), torch.zeros(4, 2048, device=dev)
        kept += [x, y]
        f.wait(f.push_pull([x], [0], [y], [1]))
        assert torch.equal(y, x * 2), (i, y)
    worker = hetmesh.stepmesh._state['worker']
    print("worker registered", worker.engine.counters()["caller_buffers"], "of", 12, flush=True)
    print("worker test done", flush=True)
elif os.environ['DMLC_ROLE'] == 'server':
    for i in range(6):
        (handler, tensors, keys), = f.get_batch()
        out = tensors[0] * 2
        kept.append(out)
        f.respond([out], handler)
    print("server test done", flush=True)
f.stop()
"""


def test_tensors_at_new_addresses_go_through_the_slots_past_the_bound():
    results = Job(FRESH, HETMESH_STEPMESH_MAX_BUFFERS="2").finish()
    assert_all_passed(results)
    out, err = results["worker0.0"][1], results["worker0.0"][2]
    assert "worker test done" in out and "server test done" in results["server0.0"][1]
    # Two allocations sent from and two received into, each 32 KiB of host memory registered by
    # its own pages; on a GPU torch's caching allocator holds them all in one or two.
    registered = int(out.split("worker registered ")[1].split()[0])
    assert registered == 4 if not CUDA else 1 <= registered <= 4, out
    for what in ("push tensors", "pull tensors"):
        assert err.count(f"fserver_lib: {what} came from more than 2 allocations") == 1, err
    assert "HETMESH_STEPMESH_MAX_BUFFERS" in err, err
    assert "respond's tensors came from more than 2 allocations" in results["server0.0"][2]


# Calls of a layout and memory seen before are checked and pushed in C++: the shim's Python path
# runs for the first call of each layout (and each new piece of memory) only, and the answers of
# every call are right. A shape past what the memory learnt (more rows from the same start) or a
# new layout goes back to the Python path. The server's side likewise: batches whose parts lie
# where one did before are handed out, and answers from memory answered from before are sent,
# from C++.
STEADY = """
import torch, os, time
import fserver_lib as f
import hetmesh
import hetmesh.stepmesh as s
dev = 'cuda:0' if os.environ.get('HM_TEST_STEPMESH_DEVICE') == 'cuda' else 'cpu'
f.init()
if os.environ.get('DMLC_ROLE') == 'worker':
    slow = []
    python_path = s._Worker._push_pull
    s._Worker._push_pull = lambda self, *a: slow.append(1) or python_path(self, *a)
    x = torch.zeros([64, 128], dtype=torch.bfloat16, device=dev)
    scale = torch.zeros([64], dtype=torch.float32, device=dev)
    y = torch.zeros([64, 128], dtype=torch.bfloat16, device=dev)
    def trip(rows, value, with_scale=True):
        x[:rows] = value
        scale[:rows] = 2
        push = [x[:rows], scale[:rows]] if with_scale else [x[:rows]]
        f.wait(f.push_pull(push, list(range(len(push))), [y[:rows]], [9]))
        factor = 2 if with_scale else 1
        assert torch.equal(y[:rows], torch.full_like(y[:rows], value * factor + 1)), (rows, value)
    for i in range(10):
        trip(16, i)
    assert len(slow) == 1, slow  # the first call only
    trip(8, 3)  # fewer rows from the same memory: still in C++
    assert len(slow) == 1, slow
    trip(32, 4)  # more rows than learnt: the Python path, once
    trip(32, 5)
    assert len(slow) == 2, slow
    trip(16, 6, with_scale=False)  # a new layout: the Python path, once
    trip(16, 7, with_scale=False)
    assert len(slow) == 3, slow
    # A wait that times out leaves the push_pull in flight (the server answers this one late);
    # waited for again, it ends, and is known to get_all_handlers and fetch_trace.
    h = f.push_pull([x[:16], scale[:16]], [0, 1], [y[:16]], [9])
    try:
        f.wait(h, 50)
        raise SystemExit("the wait did not time out")
    except hetmesh.TimeoutError:
        pass
    try:
        f.wait(h, -1)
        raise SystemExit("a negative timeout was taken")
    except hetmesh.InvalidArgumentError:
        pass
    f.wait(h)  # still in flight after both
    assert torch.equal(y[:16], torch.full_like(y[:16], 7 * 2 + 1)), y[:16]
    assert f.get_all_handlers(h) == [h, h + 1, h + 2] and len(f.fetch_trace(h + 2)) == 8
    try:
        f.wait(h)
        raise SystemExit("a push_pull was waited for twice")
    except hetmesh.InvalidArgumentError as error:
        assert f"handler {h} is not a push_pull in flight" in str(error), error
    assert len(slow) == 3, slow
    print("worker test done", flush=True)
elif os.environ.get('DMLC_ROLE') == 'server':
    out_buffer = torch.zeros([64, 128], dtype=torch.bfloat16, device=dev)
    for n in range(16):
        batch = f.get_batch()
        if n == 15:
            time.sleep(2)  # the worker's first wait for it times out
        for handler, tensors, keys in batch:
            out = out_buffer[:tensors[0].shape[0]]
            out.copy_(tensors[0] * (tensors[1].view(-1, 1) if len(tensors) > 1 else 1) + 1)
            f.respond([out], handler, need_event=True)
            tensors.clear(), keys.clear()  # the caller's own lists: the next batch's are whole
    # Batches (3 micro-batches): 16 rows with a scale x10, 8, 32 x2, 16 without x2, 16 with a
    # scale. A part's views are made in Python at the first batch of each micro-batch and rows: 8
    # handed out from C++. Answers: from out_buffer's first 16 rows, then 32 (learnt in Python):
    # 14 from C++.
    counters = s._state["server"].fast.counters()
    assert counters["batches_from_cpp"] == 8 and counters["answers_from_cpp"] == 14, counters
    assert counters["parts_unanswered"] == 0, counters
    print("server test done", flush=True)
f.stop()
"""


def test_calls_of_a_layout_seen_before_skip_the_python_path():
    results = Job(STEADY, HETMESH_STEPMESH_MICRO_BATCHES="3").finish()
    assert_all_passed(results)
    assert "worker test done" in results["worker0.0"][1]
    assert "server test done" in results["server0.0"][1]
