"""An engine's Prometheus endpoint from Python (docs/metrics.md): served where metrics_listen
says, scraped over HTTP with the counts of the round trips made, and the Grafana dashboard in
examples/ asks only for series an engine exports."""

import json
import os
import re
import threading
import urllib.request

import hetmesh

from conftest import ROOT, serve


def scrape(address):
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return reply.read().decode()


def test_an_engine_serves_its_metrics_where_asked(store, job):
    job = dict(job, attention=1, ffn=1, metrics_listen="127.0.0.1:0")
    serve(store, job)
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        for step in range(3):
            a.wait(a.push_pull(step % 2, tokens=4))
        assert re.fullmatch(r"127\.0\.0\.1:\d+", a.metrics_address), a.metrics_address
        text = scrape(a.metrics_address)
    assert re.search(r'^hetmesh_round_trip_seconds_count\{[^}]*role="attention",rank="0"[^}]*\} 3$',
                     text, re.M), text
    assert re.search(r'^hetmesh_messages_total\{[^}]*peer="ffn 0",direction="received"[^}]*\} 3$',
                     text, re.M), text
    assert re.search(r'^hetmesh_peer_up\{[^}]*peer="ffn 0"\} 1$', text, re.M), text


def series(text):
    """The names of the series in an exposition, histograms by their own name."""
    return {re.sub(r"_(bucket|sum|count)$", "", name)
            for name in re.findall(r"^(hetmesh_\w+)", text, re.M)}


def test_the_dashboard_asks_only_for_what_the_engines_export(store, job):
    ffn_text = []

    def ffn():
        with hetmesh.FfnEngine(rank=0, store=store.address, **job) as f:
            for batch in f.batches():
                f.respond(batch)
                ffn_text.append(f.metrics())

    thread = threading.Thread(target=ffn)
    thread.start()
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        a.wait(a.push_pull(0, tokens=4))
        exported = series(a.metrics())
    thread.join(timeout=120)
    exported |= series(ffn_text[-1])
    with open(os.path.join(ROOT, "examples", "grafana", "hetmesh-afd.json")) as f:
        dashboard = json.load(f)
    asked = {name for panel in dashboard["panels"] for target in panel["targets"]
             for name in re.findall(r"(hetmesh_\w+)(?=\s*[{\[])", target["expr"])}
    asked = {re.sub(r"_(bucket|sum|count)$", "", name) for name in asked}
    assert asked and asked <= exported, asked - exported
