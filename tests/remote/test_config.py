"""Remote definitions in models.toml, model names that mean a remote, and
OpenAI Batch lines: no server needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localrun.errors import ModelNotFoundError, RegistryError, RemoteUnavailableError
from localrun.remote.config import find_remote
from localrun.runtime.batch.input import finished_ids, read_lines
from localrun.store.registry import load


def registry_with(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_remotes_in_models_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = registry_with(
        tmp_path,
        '[remotes.big]\nurl = "http://gpu-box:8000/v1/"\nmodel = "Qwen/Qwen2.5-Coder-32B-Instruct"\n'
        'api_key_env = "BIG_KEY"\ntimeout = 30\n[remotes.bare]\nurl = "http://other:8000"\n',
    )
    reg = load(path)
    monkeypatch.setenv("BIG_KEY", "secret-value")
    big = find_remote("big", reg)
    assert big is not None and big == find_remote("remote:big", reg)
    assert big.url == "http://gpu-box:8000/v1" and big.model == "Qwen/Qwen2.5-Coder-32B-Instruct"
    assert big.api_key == "secret-value" and "secret-value" not in repr(big) and big.timeout_s == 30
    bare = find_remote("bare", reg)
    assert bare is not None and bare.url == "http://other:8000/v1" and bare.model is None
    assert find_remote("qwen2.5-coder:1.5b", reg) is None  # a local alias
    adhoc = find_remote("m", reg, "http://h:1/v1")
    assert adhoc is not None and adhoc.model == "m" and adhoc.api_key_env == "LOCALRUN_API_KEY"
    with pytest.raises(ModelNotFoundError, match="unknown remote 'nope'"):
        find_remote("remote:nope", reg)
    for name in ("big", "remote:big"):  # pull, show, tune, bench, serve: a local model only
        with pytest.raises(ModelNotFoundError, match="is a remote server"):
            reg.resolve(name)


def test_a_url_reads_the_key_variable_serve_reads_and_its_old_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """One key, one variable: LOCALRUN_API_KEY, as serve and ps read it; the old name when that is not set."""
    reg = load()
    for var in ("LOCALRUN_API_KEY", "LOCALRUN_REMOTE_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    bare = find_remote("http://h:1/v1", reg)
    assert bare is not None and bare.api_key is None and bare.api_key_env == "LOCALRUN_API_KEY"
    monkeypatch.setenv("LOCALRUN_REMOTE_API_KEY", "old-key")
    old = find_remote("http://h:1/v1", reg)
    assert old is not None and (old.api_key, old.api_key_env) == ("old-key", "LOCALRUN_REMOTE_API_KEY")
    monkeypatch.setenv("LOCALRUN_API_KEY", "one-key")
    for found in (find_remote("http://h:1/v1", reg), find_remote("m", reg, "http://h:1/v1")):
        assert found is not None and (found.api_key, found.api_key_env) == ("one-key", "LOCALRUN_API_KEY")


def test_the_hubs_addresses_are_models_not_servers() -> None:
    reg = load()
    for name in (
        "https://huggingface.co/me/model-GGUF/resolve/main/model-Q4_K_M.gguf",
        "https://hf.co/me/model-GGUF/resolve/main/model-Q4_K_M.gguf",
        "http://huggingface.co/me/model-GGUF",
        "https://HuggingFace.co/me/model-GGUF:Q8_0",
        "hf.co/me/model-GGUF/resolve/main/model-Q4_K_M.gguf",
    ):
        assert find_remote(name, reg) is None, name
    assert find_remote("https://router.huggingface.co/v1", reg) is not None  # a server on another of its hosts


def test_an_unreachable_server_is_a_whole_hint() -> None:
    from localrun.remote.client import RemoteClient
    from localrun.remote.config import Remote

    for remote, hint in (
        (Remote("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"), "is a server running there?"),
        (Remote("box", "http://127.0.0.1:9/v1"), "is it running? `localrun list` shows which remotes answer"),
    ):
        with RemoteClient(remote) as client, pytest.raises(RemoteUnavailableError) as refused:
            client.models(retries=False)
        assert refused.value.hint == hint


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('[remotes.x]\nurl = "gpu-box:8000"\n', "must start with http"),
        ('[remotes.x]\nmodel = "m"\n', "missing field 'url'"),
        ('[remotes.x]\nurl = "http://h/v1"\nport = 1\n', "unknown key in remote: port"),
        ('[remotes.x]\nurl = "http://h/v1"\ntimeout = -1\n', "positive number"),
        ('[remotes.smollm2]\nurl = "http://h/v1"\n', "also a model family"),
    ],
)
def test_bad_remotes_name_file_and_entry(tmp_path: Path, text: str, reason: str) -> None:
    path = registry_with(tmp_path, text)
    with pytest.raises(RegistryError, match=reason) as info:
        load(path)
    assert str(path) in info.value.message


def openai_line(**fields: object) -> str:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions"} | fields
    return json.dumps(line)


def test_openai_batch_lines() -> None:
    lines = read_lines(
        [
            openai_line(body={"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}),
            openai_line(custom_id="b", url="/v1/completions", body={"prompt": "raw text", "temperature": 0}),
            openai_line(custom_id="c", body={"messages": [{"role": "user", "content": "x"}], "logit_bias": {}}),
            openai_line(custom_id="d", body={"messages": [{"role": "user", "content": "x"}], "n": 2}),
            openai_line(custom_id="e", url="/v1/embeddings", body={"input": "x"}),
            openai_line(
                custom_id="f",
                body={
                    "messages": [
                        {"role": "developer", "content": [{"type": "text", "text": "s"}]},
                        {"role": "user", "content": "q"},
                    ],
                    "max_completion_tokens": 3,
                },
            ),
        ]
    )
    a, b, c, d, e, f = lines
    assert (a.id, a.format, a.messages, a.settings, a.error) == (
        "a",
        "openai",
        [{"role": "user", "content": "hi"}],
        {"max_tokens": 5},
        None,
    )
    assert b.raw and b.prompt == "raw text" and b.settings == {"temperature": 0}
    assert c.error is not None and "'logit_bias' is not supported" in c.error
    assert d.error is not None and "'n'" in d.error
    assert e.error is not None and "'url'" in e.error and e.id == "e"
    assert f.messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    assert f.settings == {"max_tokens": 3}


def test_resume_reads_openai_records(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text(
        json.dumps({"id": "batch_req_1", "custom_id": "a", "response": {}, "error": None})
        + "\n"
        + json.dumps({"id": 7, "text": "x"})
        + "\n"
    )
    assert finished_ids(out) == {"a", 7}


def test_http_errors_become_typed_errors() -> None:
    from localrun.errors import ContextOverflowError, RemoteError, RemoteUnavailableError, UsageError
    from localrun.remote.client import RemoteClient, Retry, retry_after
    from localrun.remote.config import Remote

    remote = Remote("box", "http://127.0.0.1:9/v1", api_key_env="BOX_KEY", api_key="k-123456")
    with RemoteClient(remote) as client:

        def error(status: int, message: str, code: str | None = None) -> Exception:
            return client.error_for(
                status, json.dumps({"error": {"message": message, "code": code}}), "chat/completions"
            )

        refused = error(401, "bad key k-123456")
        assert isinstance(refused, RemoteUnavailableError) and "k-123456" not in refused.message
        assert refused.hint == "check the key in BOX_KEY"
        assert isinstance(error(404, "The model `x` does not exist.", "model_not_found"), ModelNotFoundError)
        too_long = error(400, "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.")
        assert isinstance(too_long, ContextOverflowError) and "4096" in too_long.message
        assert isinstance(error(400, "temperature must be positive"), UsageError)
        busy = error(429, "slow down")
        assert isinstance(busy, RemoteError) and "busy (429)" in busy.message
        assert isinstance(client.error_for(500, "<html>oops</html>", "models"), RemoteError)

    import httpx2

    assert retry_after(httpx2.Headers({"Retry-After": "3"})) == 3.0
    assert retry_after(httpx2.Headers({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0  # past
    assert retry_after(httpx2.Headers({})) is None
    policy = Retry(attempts=5, base_s=0.5, max_s=4)
    assert policy.delay(0, retry_after=7) == 7
    assert all(0.25 <= policy.delay(0) <= 0.5 and policy.delay(10) <= 4 for _ in range(20))
