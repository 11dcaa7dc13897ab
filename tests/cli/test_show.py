from __future__ import annotations

import json
from pathlib import Path

import pytest

from localrun import openmp
from localrun.gguf.info import describe
from localrun.gguf.reader import read_gguf
from localrun.units import parse_size
from tests.helpers import cli


def test_show_json_from_gguf_metadata(tiny_model: Path) -> None:
    res = cli("show", str(tiny_model), "--json", "--budget", "8MB")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    # the fixture: 2 layers, 4 heads, 2 KV heads of 16 dims, trained on 512 tokens
    assert (info["architecture"], info["layers"], info["attention_heads"], info["kv_heads"]) == ("llama", 2, 4, 2)
    assert info["grouped_query_attention"] is True and info["chat_template"] is True
    assert info["attention"] == "grouped-query"
    assert info["context_length"] == 512 and info["vocab_size"] == 269
    f16 = 2 * 2 * (16 + 16) * 2
    assert info["kv_bytes_per_token"] == {
        "f16": f16,
        "q8_0": round(f16 / 2 * 34 / 32),
        "q4_0": round(f16 / 2 * 18 / 32),
    }
    # heads of 16: auto runs an f16 cache without flash attention, whose scores
    # (f32, a 512-token ubatch, 4 heads and the mask) take room for each token of context
    assert info["flash_attn_auto"] == "auto"  # nothing measured: llama.cpp's own
    assert info["wait"] == openmp.policy().as_setting()  # how llama.cpp's idle threads wait, and why
    shape = describe(read_gguf(tiny_model))
    fits = info["max_context"]["f16"]  # the longest context that fits: the trained one, or one step more would not
    assert 0 < fits <= 512 and shape.memory_needed(fits, "f16") <= 8_000_000
    assert fits == 512 or shape.memory_needed(fits + 256, "f16") > 8_000_000
    assert info["max_context"]["q4_0"] >= info["max_context"]["q8_0"] >= info["max_context"]["f16"]


def test_show_human_and_errors(tiny_model: Path) -> None:
    res = cli("show", str(tiny_model))
    assert res.returncode == 0 and "grouped-query attention" in res.stdout and "KV cache / token" in res.stdout
    assert f"waiting threads  {openmp.policy().name} (" in res.stdout and openmp.policy().why in res.stdout
    assert cli("show", str(tiny_model), "--budget", "lots").returncode == 2
    missing = cli("show", "smollm2:135m")  # known, but not downloaded here: README's 3, model not found
    assert missing.returncode == 3 and "hint: localrun pull smollm2:135m" in missing.stderr


@pytest.mark.parametrize(
    ("text", "n"), [("4GiB", 4 * 1024**3), ("512MB", 512 * 10**6), ("2.5G", 2_500_000_000), ("100", 100)]
)
def test_parse_size(text: str, n: int) -> None:
    assert parse_size(text) == n


def test_show_and_auto_context_agree_on_the_budget(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --budget, `show` and `--ctx auto` size with the same reserve from the available RAM."""
    from localrun.assemble import assemble
    from localrun.runtime import devices, placement
    from localrun.runtime.engine import Engine
    from localrun.settings import Options, resolve

    shape = describe(read_gguf(tiny_model))
    available = placement.RESERVE + shape.memory_needed(300, "f16")  # room for 256 tokens, not 512
    monkeypatch.setattr(devices, "probe", lambda: (devices.Device("CPU", "fake", "cpu", available, 2 * available),))
    shown = json.loads(cli("show", str(tiny_model), "--json").stdout)
    assert shown["budget_bytes"] == available - placement.RESERVE
    run = assemble(tiny_model, resolve(Options(kv="f16", flash_attn="on")), use_wisdom=False)
    with Engine(run.config) as engine:
        assert shown["max_context"]["f16"] == run.config.n_ctx == engine.n_ctx == 256


def test_sizes_are_said_in_binary_units(tiny_model: Path) -> None:
    from localrun.units import human_bytes

    assert (human_bytes(512), human_bytes(1536), human_bytes(2**30)) == ("512 B", "1.5 KiB", "1.0 GiB")
    shown = cli("show", str(tiny_model), "--budget", "1GiB").stdout
    assert "context in 1.0 GiB" in shown
    assert "4.0 GiB" in cli("cache", "info").stdout  # the default cap, as the README says it


def test_show_says_what_fits_each_gpu(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localrun.runtime import devices
    from localrun.runtime.placement import GPU_RESERVE

    cpu = devices.Device("CPU", "a CPU", "cpu", 8 * 2**30, 16 * 2**30)
    big = devices.Device("CUDA0", "a big GPU", "gpu", GPU_RESERVE + 2**30, 2 * GPU_RESERVE + 2**30)
    full = devices.Device("CUDA1", "a full GPU", "gpu", GPU_RESERVE // 2, 2 * GPU_RESERVE)
    monkeypatch.setattr(devices, "probe", lambda: (cpu, big, full))
    shown = json.loads(cli("show", str(tiny_model), "--json").stdout)
    gpus = {g["name"]: g for g in shown["gpus"]}
    assert gpus["CUDA0"]["layers"] == 3 and gpus["CUDA0"]["max_context"]["f16"] == 512  # all, at the trained context
    assert gpus["CUDA1"]["layers"] == 0 and gpus["CUDA1"]["max_context"] == {"f16": 0, "q8_0": 0, "q4_0": 0}
    assert shown["placement"]["n_gpu_layers"] == 3 and shown["placement"]["model"].startswith("CUDA0, all")
    text = cli("show", str(tiny_model)).stdout
    assert "on CUDA0" in text and "the whole model with context f16 512" in text and "on CUDA1" in text


def test_one_kv_head_is_multi_query_attention(tmp_path: Path) -> None:
    from tests.tinymodel import write_tiny_model

    model = write_tiny_model(tmp_path / "mqa.gguf", n_head=4, n_head_kv=1)
    res = cli("show", str(model))
    assert res.returncode == 0, res.stderr
    assert "1 KV head (multi-query attention: the 4 query heads share it)" in res.stdout
    assert "grouped" not in res.stdout
    assert json.loads(cli("show", str(model), "--json").stdout)["attention"] == "multi-query"
    assert "flash attention  auto: llama.cpp decides" in res.stdout  # as --json's "auto" says, nothing more


def test_show_says_what_memory_a_context_holds(tiny_model: Path, tmp_path: Path) -> None:
    """A transformer: a KV cache in every layer, no state. A hybrid (Qwen3.5,
    an attention layer in four): the KV cache of that layer alone, and the
    recurrent state each sequence holds whatever its length."""
    from tests.hybridmodels import BY_NAME, write_hybrid_model

    plain = json.loads(cli("show", str(tiny_model), "--json").stdout)
    assert (plain["memory"], plain["attention_layers"], plain["recurrent_state_bytes"]) == ("attention", 2, 0)
    assert "memory           attention: a KV cache in 2 of 2 layers" in cli("show", str(tiny_model)).stdout
    model = write_hybrid_model(BY_NAME["qwen35"], tmp_path / "qwen35.gguf")
    res = cli("show", str(model), "--json", "--budget", "64MiB")
    assert res.returncode == 0, res.stderr
    shown = json.loads(res.stdout)
    shape = describe(read_gguf(model))
    assert (shown["memory"], shown["layers"], shown["attention_layers"]) == ("hybrid", 4, 1)
    assert shown["recurrent_state_bytes"] == shape.recurrent_bytes() > 0
    assert shown["kv_bytes_per_token"]["f16"] == 1 * 2 * (32 + 32) * 2  # one layer's 2 KV heads of 32
    text = cli("show", str(model)).stdout
    assert (
        "memory           hybrid: a KV cache in 1 of 4 layers, a recurrent state in 3 (16.5 KiB per sequence)" in text
    )
    mamba = write_hybrid_model(BY_NAME["mamba2"], tmp_path / "mamba2.gguf")
    text = cli("show", str(mamba)).stdout
    assert "recurrent: a state in 2 of 2 layers" in text and "no KV cache" in text and "attention        none" in text
