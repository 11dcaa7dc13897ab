from __future__ import annotations

import pytest

from localrun.config import UserConfig
from localrun.errors import UsageError
from localrun.settings import DEFAULT_TEMPERATURE, Options, parse_ctx, resolve, sampling_defaults


def test_each_setting_takes_the_first_source_that_has_it() -> None:
    user = UserConfig(kv_k="q4_0", kv_v="q4_0", flash_attn="off", threads=3, draft="lookup", parallel=4)
    model = {"ctx": 8192, "kv": "q8_0", "system": "be brief"}
    got = resolve(Options(kv_v="f16", threads=1), model, user)
    assert (got.n_ctx, got.type_k, got.type_v, got.threads, got.system) == (8192, "q8_0", "f16", 1, "be brief")
    assert (got.flash_attn, got.draft, got.parallel, got.memory_budget) == ("off", "lookup", 4, None)
    assert got.sources == {
        "ctx": "model",
        "type_k": "model",
        "type_v": "option",
        "flash_attn": "config",
        "threads": "option",
        "memory_budget": "default",
        "system": "model",
        "draft": "config",
        "parallel": "config",
        "gpu_layers": "default",
        "device": "default",
        "sample_on": "default",
    }


def test_built_in_defaults_when_nothing_says_otherwise() -> None:
    got = resolve(Options())
    assert (got.n_ctx, got.type_k, got.type_v, got.flash_attn, got.draft) == (None, "auto", "auto", "auto", "auto")
    assert set(got.sources.values()) == {"default"}


def test_an_explicit_auto_context_overrides_the_model_default() -> None:
    assert resolve(Options(ctx="auto"), {"ctx": 8192}).n_ctx is None
    assert resolve(Options(ctx="2048"), {"ctx": 8192}).n_ctx == 2048
    assert resolve(Options(), {"ctx": 8192}).n_ctx == 8192


def test_kv_applies_to_both_unless_one_is_given() -> None:
    got = resolve(Options(kv="q8_0", kv_k="f16"))
    assert (got.type_k, got.type_v) == ("f16", "q8_0")
    got = resolve(Options(), {"kv_v": "q4_0", "kv": "q8_0"})
    assert (got.type_k, got.type_v) == ("q8_0", "q4_0")


def test_parse_ctx() -> None:
    assert parse_ctx("auto") is None and parse_ctx("4096") == 4096
    with pytest.raises(UsageError, match="not a number"):
        parse_ctx("lots")


def test_option_values_are_checked_and_named() -> None:
    with pytest.raises(UsageError, match=r"unknown KV cache type 'q5_0' for --kv$"):
        resolve(Options(kv="q5_0"))
    with pytest.raises(UsageError, match="for --kv-v"):
        resolve(Options(kv_v="f32"))
    with pytest.raises(UsageError, match="unknown --flash-attn value 'maybe'"):
        resolve(Options(flash_attn="maybe"))


def test_the_system_prompt_falls_back_to_the_config() -> None:
    user = UserConfig(system="from the config")
    assert resolve(Options(), None, user).system == "from the config"
    assert resolve(Options(), None, user).sources["system"] == "config"
    assert resolve(Options(), {"system": "from the registry"}, user).system == "from the registry"
    assert resolve(Options(system="given"), {"system": "from the registry"}, user).system == "given"


def test_temperature_and_max_tokens_take_the_option_then_the_config() -> None:
    assert sampling_defaults(None, None) == (DEFAULT_TEMPERATURE, None)
    user = UserConfig(temperature=0.2, max_tokens=64)
    assert sampling_defaults(None, None, user) == (0.2, 64)
    assert sampling_defaults(0.0, 5, user) == (0.0, 5)  # 0 is a value given, not "not given"
