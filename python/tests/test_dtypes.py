"""The A2F dtype from Python: a config made of keywords carries bf16 (a file's default stays
fp8), so floats written into A's tokens arrive as floats; and an fp8 slot on a torch that cannot
compute on fp8 is an error, never a silent uint8 view (1.7 would become 1)."""

import pytest
import torch

import hetmesh
from conftest import doubling_ffn, serve


def test_a_config_from_keywords_defaults_a2f_to_bf16_and_a_file_keeps_fp8(tmp_path):
    assert hetmesh.config(attention=1, ffn=1).a2f_dtype == "bf16"
    assert hetmesh.config(a2f_dtype="fp8").a2f_dtype == "fp8"  # asked for, kept
    empty = tmp_path / "job.toml"
    empty.write_text("")
    assert hetmesh.config(empty).a2f_dtype == "fp8"  # the file format's default, unchanged


def test_floats_written_by_an_attention_instance_come_back_as_floats(store, job, spawn):
    ffn = doubling_ffn(spawn, store, job)  # tokens.float() * 2 into the output
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        tokens = hetmesh.as_tensor(a.tokens(0))
        assert tokens.dtype == torch.bfloat16
        tokens.fill_(1.7)
        a.wait(a.push_pull(0))
        result = torch.from_dlpack(a.result(0, 0)).float()
    expected = torch.tensor(1.7, dtype=torch.bfloat16).float() * 2
    assert torch.equal(result, torch.full_like(result, float(expected)))  # 3.40625, not 2
    code, out, err = ffn.finish()
    assert code == 0, err


@pytest.mark.skipif(hasattr(torch, "float8_e4m3fn"), reason="this torch computes on fp8")
def test_as_tensor_refuses_fp8_where_torch_has_no_fp8_and_raw_gives_bytes(store, job):
    job.update(a2f_dtype="fp8", ffn=1)
    ffn = serve(store, job)
    with hetmesh.AttentionEngine(rank=0, store=store.address, **job) as a:
        with pytest.raises(hetmesh.NotSupportedError) as caught:
            hetmesh.as_tensor(a.tokens(0))
        message = str(caught.value)
        assert f"torch {torch.__version__}" in message
        assert "bf16" in message and "float8_e4m3fn" in message and "raw=True" in message
        raw = hetmesh.as_tensor(a.tokens(0), raw=True)
        assert raw.dtype == torch.uint8 and raw.shape == (8, 16)
        assert hetmesh.as_tensor(a.result(0, 0)).dtype == torch.bfloat16  # not fp8: as ever
    ffn.join(60)  # its engine gone before the interpreter ends
    assert not ffn.is_alive()
