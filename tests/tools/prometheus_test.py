#!/usr/bin/env python3
"""A real Prometheus (Debian's) scrapes a running 2A2F job (docs/metrics.md).

The job (`hetmesh bench afd`, four instances on this host) serves its metrics on 0.0.0.0, beyond
loopback, so every scrape must carry the bearer token derived from the job's secret
(`hetmesh config --metrics-token`). Prometheus scrapes the four instances twice over: once with
the token from a file, once without. Its query API must then return every instance up with the
token and none without, and the job's series with their labels: round trips on each A, parts
received on each F, per peer, and a round-trip quantile computed from the histogram. promtool
lints one instance's exposition.

    prometheus_test.py HETMESH
"""
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

HETMESH = sys.argv[1]
DEADLINE = time.monotonic() + 150
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def free_ports(count):
    """A base port with `count` free ports from it."""
    for _ in range(200):
        base = random.randrange(10000, 32768 - count)  # below Linux's ephemeral ports
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free ports")


def query(prometheus, expression):
    url = f"http://{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    with urllib.request.urlopen(url, timeout=5) as reply:
        answer = json.load(reply)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def main():
    if not shutil.which("prometheus"):
        print("SKIP: no prometheus (ci/install-deps.sh installs Debian's)")
        return 77
    scratch = tempfile.mkdtemp()
    processes = []

    def stop():
        for p in processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in processes:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(scratch, ignore_errors=True)

    try:
        secret = os.path.join(scratch, "job.secret")
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, os.urandom(32).hex().encode() + b"\n")
        os.close(fd)
        base = free_ports(4)
        config = os.path.join(scratch, "job.toml")
        with open(config, "w") as f:
            f.write(f"""[job]
attention = 2
ffn = 2
[model]
tokens = 16
hidden = 256
[rendezvous]
secret_file = "{secret}"
[tracing]
chrome_trace = ""
[metrics]
listen = "0.0.0.0:{base}"
""")
        token = subprocess.run([HETMESH, "config", "--config", config, "--metrics-token"],
                               check=True, capture_output=True, text=True).stdout.strip()
        check(len(token) == 64, f"hetmesh config --metrics-token gives a token ({token[:8]}...)")
        token_file = os.path.join(scratch, "token")
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, token.encode())
        os.close(fd)

        targets = json.dumps([f"127.0.0.1:{base + i}" for i in range(4)])
        prometheus_port = free_ports(1)
        prometheus = f"127.0.0.1:{prometheus_port}"
        with open(os.path.join(scratch, "prometheus.yml"), "w") as f:
            f.write(f"""global:
  scrape_interval: 500ms
  scrape_timeout: 400ms
scrape_configs:
  - job_name: hetmesh
    authorization:
      type: Bearer
      credentials_file: {token_file}
    static_configs:
      - targets: {targets}
  - job_name: hetmesh-no-token
    static_configs:
      - targets: {targets}
""")
        job = subprocess.Popen(
            [HETMESH, "bench", "afd", "--config", config, "--iterations", "1000000",
             "--warmup", "0", "--no-bare"],
            stdout=open(os.path.join(scratch, "job.log"), "w"), stderr=subprocess.STDOUT,
            cwd=scratch)
        processes.append(job)
        server = subprocess.Popen(
            ["prometheus", f"--config.file={scratch}/prometheus.yml",
             f"--storage.tsdb.path={scratch}/tsdb", f"--web.listen-address={prometheus}"],
            stdout=open(os.path.join(scratch, "prometheus.log"), "w"), stderr=subprocess.STDOUT,
            cwd=scratch)
        processes.append(server)

        # Every instance up with the token, and a few scrapes in.
        up = []
        while time.monotonic() < DEADLINE and job.poll() is None:
            time.sleep(0.5)
            try:
                up = query(prometheus, 'up{job="hetmesh"} == 1')
                scraped = query(prometheus,
                                'min(count_over_time(hetmesh_round_trip_seconds_count'
                                '{job="hetmesh"}[1m]))')
            except OSError:
                continue  # Prometheus is not listening yet
            if len(up) == 4 and scraped and float(scraped[0]["value"][1]) >= 3:
                break
        check(job.poll() is None, "the job is running while Prometheus scrapes it")
        check(len(up) == 4, f"every instance is up with the token: {len(up)} of 4")
        refused = query(prometheus, 'up{job="hetmesh-no-token"}')
        check(len(refused) == 4 and all(r["value"][1] == "0" for r in refused),
              "without the token, every instance refuses the scrape (up == 0)")

        trips = query(prometheus, 'hetmesh_round_trip_seconds_count{job="hetmesh"}')
        check(sorted(t["metric"].get("rank") for t in trips) == ["0", "1"] and
              all(t["metric"].get("role") == "attention" and t["metric"].get("host") and
                  float(t["value"][1]) > 0 for t in trips),
              f"each A's round trips, labelled role, rank and host: {trips}")
        received = query(prometheus, 'hetmesh_messages_total{job="hetmesh",role="ffn",'
                                      'direction="received"}')
        pairs = sorted((r["metric"]["rank"], r["metric"]["peer"]) for r in received
                       if float(r["value"][1]) > 0)
        check(pairs == [("0", "attention 0"), ("0", "attention 1"), ("1", "attention 0"),
                        ("1", "attention 1")],
              f"each F received parts from each A: {pairs}")
        check(all(r["metric"].get("transport") == "ipc" for r in received),
              "the parts are labelled with their transport")
        p50 = query(prometheus, 'histogram_quantile(0.5, sum by (le) '
                                '(rate(hetmesh_round_trip_seconds_bucket{job="hetmesh"}[5s])))')
        value = float(p50[0]["value"][1]) if p50 else float("nan")
        check(0 < value < 10, f"a round trip's p50 from the histogram: {value * 1e6:.1f} us")

        request = urllib.request.Request(f"http://127.0.0.1:{base}/metrics",
                                         headers={"Authorization": f"Bearer {token}"})
        exposition = urllib.request.urlopen(request, timeout=5).read()
        lint = subprocess.run(["promtool", "check", "metrics"], input=exposition,
                              capture_output=True)
        check(lint.returncode == 0,
              f"promtool check metrics: {(lint.stdout + lint.stderr).decode().strip() or 'clean'}")
        if failures:
            for name in ("job.log", "prometheus.log"):
                print(f"--- {name} (tail)")
                with open(os.path.join(scratch, name)) as f:
                    print("".join(f.readlines()[-20:]))
    finally:
        stop()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
