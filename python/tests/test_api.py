"""The package's surface: version, devices, configs from files and keyword arguments, and the
arguments an engine refuses before it reaches anything."""

import pytest

import hetmesh


def test_version_is_the_project_version():
    major, minor, patch = hetmesh.__version__.split(".")
    assert (major, minor) == ("0", "1") and patch.isdigit()


def test_devices_lists_the_reference_plugins():
    selectors = [d["selector"] for d in hetmesh.devices()]
    assert "cpu:0" in selectors and "asic_stub:0" in selectors
    cpu = next(d for d in hetmesh.devices() if d["selector"] == "cpu:0")
    assert cpu["plugin"] == "cpu" and "device_memory" in cpu["capabilities"]


def test_config_from_keyword_arguments():
    c = hetmesh.config(attention=2, ffn=3, tokens=64, hidden=128, a2f_dtype="bf16",
                       ffn_devices="asic_stub:0")
    assert (c.attention, c.ffn, c.tokens, c.hidden, c.a2f_dtype) == (2, 3, 64, 128, "bf16")
    assert c.ffn_devices == ["asic_stub:0"] * 3
    assert "attention = 2" in c.to_toml()


def test_config_from_a_file(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[job]\nattention = 2\nffn = 2\n\n[model]\nhidden = 64\n")
    c = hetmesh.config(path)
    assert (c.attention, c.ffn, c.hidden) == (2, 2, 64)


def test_an_unknown_setting_is_named_with_a_suggestion():
    with pytest.raises(TypeError, match=r"unknown job setting 'micro_batch' \(did you mean "
                                        r"micro_batches\?\)"):
        hetmesh.config(micro_batch=2)


def test_a_bad_value_is_refused_by_the_config_reader_naming_its_key():
    with pytest.raises(hetmesh.InvalidArgumentError, match="top_k") as caught:
        hetmesh.config(experts=2, top_k=3)
    assert caught.value.status_name == "HM_ERR_INVALID_ARGUMENT"
    assert isinstance(caught.value, ValueError)


def test_a_missing_config_file_is_named(tmp_path):
    with pytest.raises(hetmesh.InvalidArgumentError, match="nope.toml"):
        hetmesh.config(tmp_path / "nope.toml")


def test_a_file_and_keyword_arguments_together_are_refused(tmp_path):
    with pytest.raises(TypeError, match="not both"):
        hetmesh.config(tmp_path / "job.toml", ffn=2)


def test_an_engine_needs_the_stores_real_address(job):
    with pytest.raises(hetmesh.InvalidArgumentError, match="port 0 is only for the process"):
        hetmesh.AttentionEngine(rank=0, **job)


def test_a_rank_outside_the_job_is_refused(store, job):
    with pytest.raises(hetmesh.InvalidArgumentError, match=r"rank 1: the job has 1 ffn"):
        hetmesh.FfnEngine(rank=1, store=store.address, **job)


def test_a_device_nobody_offers_is_refused_naming_what_there_is(store, job):
    with pytest.raises(hetmesh.InvalidArgumentError,
                       match=r"no plugin named 'nosuch' was loaded \(loaded: .*cpu"):
        hetmesh.AttentionEngine(rank=0, store=store.address, device="nosuch:3", **job)
