"""examples/kubernetes: the manifests of a 2A2F job as an indexed Job and as a LeaderWorkerSet,
checked as far as this machine can (no cluster, and no offline checker of Kubernetes' schema in
Debian 12): each config they carry is read by hetmesh's own reader; as many pods as the job has
instances; every pod runs `hetmesh run` on the mounted config; the store's host is process 0's
[hosts] name; the job's secret is mounted as a file (subPath: not the volume's symlink, which
hetmesh refuses) of mode 0400, where HETMESH_JOB_SECRET_FILE names it; each [hosts] name is the
DNS name Kubernetes gives that pod."""

import os
import tomllib

import yaml

import hetmesh
from conftest import ROOT

FOLDER = os.path.join(ROOT, "examples", "kubernetes")


def documents(name):
    with open(os.path.join(FOLDER, name)) as f:
        return {d["kind"]: d for d in yaml.safe_load_all(f)}


def job_config(config_map, tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(config_map["data"]["job.toml"])
    return hetmesh.config(path)


def hosts_of(config):
    """Process i's [hosts] address, i as `hetmesh run` numbers them (attention, then ffn)."""
    hosts = tomllib.loads(config.to_toml())["hosts"]
    return list(hosts["attention"]) + list(hosts["ffn"])


def check_pod(pod_spec, config_map_name, master_addr=None):
    """The container runs hetmesh on the mounted config with the secret as a 0400 file."""
    (container,) = pod_spec["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    assert container["command"][:3] == ["hetmesh", "run", "--config"]
    assert container["command"][3] == os.path.join(mounts["job"]["mountPath"], "job.toml")
    assert volumes["job"]["configMap"]["name"] == config_map_name
    secret = mounts["secret"]
    assert secret["subPath"] == "job.secret" and secret["mountPath"] == env[
        "HETMESH_JOB_SECRET_FILE"]
    assert volumes["secret"]["secret"]["defaultMode"] == 0o400
    assert int(env["MASTER_PORT"]) > 0
    if master_addr is not None:
        assert env["MASTER_ADDR"] == master_addr


def test_the_indexed_job_runs_one_pod_an_instance(tmp_path):
    docs = documents("indexed-job.yaml")
    config = job_config(docs["ConfigMap"], tmp_path)
    job, service = docs["Job"], docs["Service"]
    instances = config.attention + config.ffn
    assert job["apiVersion"] == "batch/v1" and job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == instances
    pod = job["spec"]["template"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    subdomain = pod["spec"]["subdomain"]
    assert subdomain == service["metadata"]["name"]
    # Pod i of an indexed Job is <job>-<i>; with the subdomain, <job>-<i>.<subdomain>.
    names = [f"{job['metadata']['name']}-{i}.{subdomain}" for i in range(instances)]
    assert hosts_of(config) == names
    check_pod(pod["spec"], docs["ConfigMap"]["metadata"]["name"], master_addr=names[0])


def test_the_leaderworkerset_group_is_the_job(tmp_path):
    docs = documents("leaderworkerset.yaml")
    config = job_config(docs["ConfigMap"], tmp_path)
    lws = docs["LeaderWorkerSet"]
    template = lws["spec"]["leaderWorkerTemplate"]
    instances = config.attention + config.ffn
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert template["size"] == instances
    name = lws["metadata"]["name"]
    # LWS names the leader <set>-<group>, worker i <set>-<group>-<i>, under a headless Service
    # named after the set; its leader's address is LWS_LEADER_ADDRESS (hetmesh's MASTER_ADDR).
    names = [f"{name}-0.{name}"] + [f"{name}-0-{i}.{name}" for i in range(1, instances)]
    assert hosts_of(config) == names
    for role in ("leaderTemplate", "workerTemplate"):
        check_pod(template[role]["spec"], docs["ConfigMap"]["metadata"]["name"])
