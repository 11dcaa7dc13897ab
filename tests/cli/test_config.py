from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from localrun import config, paths
from localrun.errors import ConfigError
from localrun.store import registry
from localrun.units import human_bytes
from tests.helpers import Result, cli
from tests.tinymodel import write_tiny_model


def write_config(text: str) -> Path:
    path = config.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_no_file_means_no_defaults() -> None:
    assert not config.config_file().exists()
    assert config.load() == config.UserConfig()


def test_values_are_typed() -> None:
    write_config(
        '[defaults]\nkv_k = "q8_0"\nkv_v = "q4_0"\nflash_attn = "on"\nthreads = 3\n'
        'draft = "qwen2.5-coder:0.5b"\nparallel = 4\nmemory_budget = "2GiB"\n'
    )
    assert config.load() == config.UserConfig(
        kv_k="q8_0",
        kv_v="q4_0",
        flash_attn="on",
        threads=3,
        draft="qwen2.5-coder:0.5b",
        parallel=4,
        memory_budget=2 * 2**30,
    )
    write_config("[defaults]\nmemory_budget = 1000000\n")
    assert config.load().memory_budget == 1_000_000
    write_config("[defaults]\nmarkdown = false\n")
    assert config.load().markdown is False
    write_config('[defaults]\nmodel = "qwen2.5-coder:0.5b"\ntemperature = 0\nmax_tokens = 64\nsystem = "Be brief."\n')
    assert config.load() == config.UserConfig(
        model="qwen2.5-coder:0.5b", temperature=0.0, max_tokens=64, system="Be brief."
    )


@pytest.mark.parametrize(
    ("text", "where", "reason"),
    [
        ("[defaults\n", "", "not valid TOML"),
        ("threads = 2\n", "", "unknown top-level key: threads"),
        ("defaults = 3\n", "", "must be a table"),
        ("[defaults]\nkv = 'q8_0'\n", "[defaults] kv", "unknown key"),
        ("[defaults]\nkv_k = 'q5_1'\n", "[defaults] kv_k", "not one of auto, f16, q8_0, q4_0"),
        ("[defaults]\nflash_attn = true\n", "[defaults] flash_attn", "not one of auto, on, off"),
        ("[defaults]\nthreads = 'two'\n", "[defaults] threads", "whole number"),
        ("[defaults]\nthreads = 0\n", "[defaults] threads", "whole number"),
        ("[defaults]\nparallel = true\n", "[defaults] parallel", "whole number"),
        ("[defaults]\nmemory_budget = 'lots'\n", "[defaults] memory_budget", "not a size"),
        ("[defaults]\ndraft = ''\n", "[defaults] draft", "non-empty"),
        ("[defaults]\nmarkdown = 'off'\n", "[defaults] markdown", "true or false"),
        ("[defaults]\nmodel = ''\n", "[defaults] model", "non-empty"),
        ("[defaults]\ntemperature = -0.5\n", "[defaults] temperature", "0 (greedy) or more"),
        ("[defaults]\ntemperature = 'hot'\n", "[defaults] temperature", "0 (greedy) or more"),
        ("[defaults]\ntemperature = nan\n", "[defaults] temperature", "0 (greedy) or more"),
        ("[defaults]\nmax_tokens = 0\n", "[defaults] max_tokens", "whole number"),
        ("[defaults]\nmax_tokens = 1.5\n", "[defaults] max_tokens", "whole number"),
        ("[defaults]\nsystem = 3\n", "[defaults] system", "non-empty"),
    ],
)
def test_bad_content_names_the_file_and_key(text: str, where: str, reason: str) -> None:
    path = write_config(text)
    with pytest.raises(ConfigError) as caught:
        config.load()
    assert caught.value.message.startswith(f"{path}: {where}".rstrip())
    assert reason in caught.value.message


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("[defaults]\ntemp = 0.2\n", "did you mean temperature?"),  # llama.cpp's word
        ("[defaults]\nmax_token = 5\n", "did you mean max_tokens?"),
        ('model = "qwen2.5-coder:0.5b"\n', "model belongs in [defaults]: move it below a [defaults] line"),
        (
            'model = "x"\nthreads = 2\n[defaults]\ntemperature = 0\n',
            "model, threads belong in [defaults]: move them below a [defaults] line",
        ),
        ("[default]\nthreads = 2\n", "did you mean [defaults]?"),
        ("[defaults]\nbogus = 1\n", "fix or remove the config file named above"),  # nothing near it
    ],
)
def test_a_misspelt_or_misplaced_key_says_what_was_meant(text: str, hint: str) -> None:
    write_config(text)
    with pytest.raises(ConfigError) as caught:
        config.load()
    assert caught.value.hint == hint


def test_a_top_level_model_is_pointed_to_defaults(tiny_model: Path) -> None:
    path = write_config('model = "qwen2.5-coder:0.5b"\n')
    res = cli("generate", "-m", str(tiny_model), "-n", "2", "hi")
    assert res.returncode == 6
    assert res.stderr == (
        f"error: {path}: unknown top-level key: model\n"
        "hint: model belongs in [defaults]: move it below a [defaults] line\n"
    )


def test_a_broken_config_stops_generate_with_exit_6(tiny_model: Path) -> None:
    path = write_config("[defaults]\nthreads = -1\n")
    res = cli("generate", "-m", str(tiny_model), "-n", "2", "hi")
    assert res.returncode == 6
    assert str(path) in res.stderr and "threads" in res.stderr and "Traceback" not in res.stderr


def test_a_bad_temperature_in_the_config_stops_chat_with_exit_6(tiny_model: Path) -> None:
    path = write_config("[defaults]\ntemperature = -1\n")
    res = cli("chat", "-m", str(tiny_model), input="hi\n")
    assert res.returncode == 6
    assert res.stderr.startswith(f"error: {path}: [defaults] temperature: -1 must be a number"), res.stderr


def done(res: Result) -> dict[str, Any]:
    assert res.returncode == 0, res.stderr[-2000:]
    record: dict[str, Any] = json.loads(res.stdout.splitlines()[-1])
    assert record["type"] == "done"
    return record


def test_the_config_names_the_default_model_and_max_tokens(tiny_model: Path, eos_model: Path) -> None:
    write_config(f"[defaults]\nmodel = {json.dumps(str(tiny_model))}\nmax_tokens = 2\n")
    assert done(cli("generate", "--json", "hi"))["generated_tokens"] == 2
    assert done(cli("generate", "--json", "-n", "3", "hi"))["generated_tokens"] == 3  # the option wins
    assert json.loads(cli("logs", "--json", "-n", "1").stdout)[0]["model"] == "tiny.gguf"
    cli("generate", "--json", "hi", env={"LOCALRUN_MODEL": str(eos_model)})  # the environment wins over it
    assert json.loads(cli("logs", "--json", "-n", "1").stdout)[0]["model"] == "tiny-eos.gguf"
    cli("generate", "--json", "-m", str(eos_model), "hi")
    assert json.loads(cli("logs", "--json", "-n", "1").stdout)[0]["model"] == "tiny-eos.gguf"


def test_list_marks_the_config_default() -> None:
    def defaults() -> list[str]:
        return [m["alias"] for m in json.loads(cli("list", "--json").stdout)["models"] if m["default"]]

    assert defaults() == ["qwen2.5-coder:1.5b"]
    write_config('[defaults]\nmodel = "smollm2"\n')
    assert defaults() == ["smollm2:135m"]
    write_config('[defaults]\nmodel = "some/file.gguf"\n')
    assert defaults() == []


def text_of(res: Result) -> str:
    return "".join(json.loads(line).get("text", "") for line in res.stdout.splitlines())


def test_the_config_sets_the_temperature_and_system_prompt(tiny_model: Path) -> None:
    args = ("generate", "-m", str(tiny_model), "--json", "-n", "8", "--seed", "7", "hi")
    plain, greedy = cli(*args), cli(*args, "-t", "0")
    assert text_of(plain) != text_of(greedy)  # this seed samples away from the greedy choice
    write_config("[defaults]\ntemperature = 0\n")
    assert text_of(cli(*args)) == text_of(greedy)
    assert text_of(cli(*args, "-t", "0.8")) == text_of(plain)  # the option wins
    write_config('[defaults]\nsystem = "You review code and answer in one short line."\n')
    with_system = done(cli(*args))["prompt_tokens"]
    assert with_system > done(plain)["prompt_tokens"]  # the system prompt is in the prompt
    assert done(cli(*args, "-s", "x"))["prompt_tokens"] < with_system  # the option wins


def test_save_defaults_merges_and_writes_atomically() -> None:
    write_config('[defaults]\nthreads = 2\nkv_k = "f16"\n')
    written = config.save_defaults({"kv_k": "q8_0", "kv_v": "q8_0", "memory_budget": "3GiB"})
    assert written == config.config_file()
    assert config.load() == config.UserConfig(kv_k="q8_0", kv_v="q8_0", threads=2, memory_budget=3 * 2**30)
    assert [p.name for p in written.parent.iterdir()] == ["config.toml"]  # no temporary file left
    with pytest.raises(ConfigError, match="parallel"):
        config.save_defaults({"parallel": 0})
    assert config.load().kv_k == "q8_0"  # a refused save leaves the file as it was


def test_save_defaults_refuses_to_build_on_a_broken_file() -> None:
    path = write_config("[defaults]\nbogus = 1\n")
    with pytest.raises(ConfigError, match="bogus"):
        config.save_defaults({"threads": 2})
    assert path.read_text() == "[defaults]\nbogus = 1\n"


def test_save_defaults_creates_the_folder() -> None:
    assert not paths.config_dir().exists()
    config.save_defaults({"draft": 'a "quoted" name'})
    assert config.load().draft == 'a "quoted" name'


# ----------------------------------------------------------- precedence --

KV_LINE = re.compile(r"K \((\w+)\):.*V \((\w+)\):")


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Head size 32: what quantized KV cache blocks need."""
    return write_tiny_model(tmp_path_factory.mktemp("cfg") / "wide.gguf", n_embd=128, n_head=4, n_head_kv=2)


def kv_types(*args: str) -> tuple[str, str]:
    """The K and V cache types llama.cpp allocated for `generate ARGS`."""
    res = cli("generate", "--verbose", "-n", "2", *args, "hi")
    assert res.returncode == 0, res.stderr[-2000:]
    found = KV_LINE.search(res.stderr)
    assert found, res.stderr[-2000:]
    return found.group(1), found.group(2)


def registered(model: Path, defaults: str) -> str:
    """An alias for ``model`` in the user's models.toml, already in localrun's
    cache (a mirror copy), with these registry defaults."""
    data = model.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    cached = paths.cache_dir() / "mirror" / sha / "wide.gguf"
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(data)
    path = registry.user_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'[models."wide:test"]\nrepo = "tester/wide"\nfile = "wide.gguf"\ndefaults = {{ {defaults} }}\n'
        f'[[models."wide:test".mirrors]]\nsha256 = "{sha}"\n'
        'parts = [{ wheel = "wide-part==1.0", member = "wide.gguf" }]\n'
    )
    return "wide:test"


def test_precedence_option_then_registry_then_config(wide_model: Path) -> None:
    model = str(wide_model)
    assert kv_types("-m", model) == ("f16", "f16")  # built-in default
    write_config('[defaults]\nkv_k = "q8_0"\nkv_v = "q8_0"\n')
    assert kv_types("-m", model) == ("q8_0", "q8_0")  # the config applies
    assert kv_types("-m", model, "--kv", "f16") == ("f16", "f16")  # an option wins over it
    assert kv_types("-m", model, "--kv-v", "q4_0") == ("q8_0", "q4_0")
    alias = registered(wide_model, 'kv = "q4_0"')
    assert kv_types("-m", alias) == ("q4_0", "q4_0")  # the registry entry wins over the config
    assert kv_types("-m", alias, "--kv-k", "f16") == ("f16", "q4_0")  # and an option over both


def test_config_flash_attention_and_budget_apply(wide_model: Path) -> None:
    write_config('[defaults]\nkv_v = "q8_0"\nflash_attn = "off"\n')
    res = cli("generate", "-m", str(wide_model), "-n", "2", "hi")
    assert res.returncode == 2 and "needs flash attention" in res.stderr
    assert kv_types("-m", str(wide_model), "--flash-attn", "on") == ("f16", "q8_0")
    write_config("[defaults]\nthreads = 1\nmemory_budget = 100000\n")
    res = cli("generate", "-m", str(wide_model), "-n", "2", "hi")
    assert res.returncode == 2 and "does not fit in" in res.stderr
    write_config("[defaults]\nthreads = 1\nmemory_budget = '1GiB'\n")
    res = cli("generate", "-m", str(wide_model), "-n", "2", "--stats", "hi")
    assert res.returncode == 0, res.stderr


def test_chat_takes_the_config_too(wide_model: Path) -> None:
    write_config('[defaults]\nkv_k = "q8_0"\n')
    res = cli("chat", "--verbose", "-m", str(wide_model), "-n", "2", input="hi\n")
    assert res.returncode == 0, res.stderr[-2000:]
    found = KV_LINE.search(res.stderr)
    assert found and found.groups() == ("q8_0", "f16")


def test_declining_a_confirmation_keeps_the_files_and_exits_0(wide_model: Path) -> None:
    from localrun.runtime.promptcache import SUFFIX

    alias = registered(wide_model, "")
    kept = cli("rm", alias, input="n\n", stdin_tty=True)
    assert kept.returncode == 0 and f"kept {alias}" in kept.stderr
    assert f"delete {alias} ({human_bytes(wide_model.stat().st_size)})?" in kept.stderr  # the size it would free
    assert json.loads(cli("list", "--json").stdout)["models"][-1]["present"] is True
    entry = paths.cache_dir() / "prompts" / f"entry{SUFFIX}"
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b"x")
    cleared = cli("cache", "clear", input="n\n", stdin_tty=True)
    assert cleared.returncode == 0 and "kept the prompt cache" in cleared.stderr and entry.exists()
