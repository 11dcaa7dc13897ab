"""``POST /apply-template``, as llama-server answers it: the prompt a
chat-completions body renders to, ``{"prompt": ...}``, without generating.

The prompt is the chat template's text as the model decodes it: the BOS the
tokenizer adds by itself is not in it (llama.cpp strips it as well), and the
server's default system prompt (``serve --system``) comes first where the
conversation has none, and the tools are what serve gives the template (for
one that takes none, described in the system prompt): the prompt is the one a
chat completion of the same body evaluates."""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool

from localrun.errors import InvalidRequestError, UsageError
from localrun.runtime.chat_request import render_request, strip_bos
from localrun.serve.reading import served_body
from localrun.serve.router import ModelTable
from localrun.serve.schemas import json_object
from localrun.serve.served import ServedModel


def apply_template(model: ServedModel, body: dict[str, Any]) -> dict[str, str]:
    if model.template is None:
        raise InvalidRequestError(f"{model.id} has no chat template", "messages")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequestError("'messages' is required and must be an array", "messages")
    if model.system and not any(isinstance(m, dict) and m.get("role") == "system" for m in messages):
        body = {**body, "messages": [{"role": "system", "content": model.system}, *messages]}
    engine = model.engine
    try:
        served = served_body(model.template, body)  # the tool block serve adds, where the template has none
        prompt = render_request(model.template, served, bos_token=engine.bos_token, eos_token=engine.eos_token)
    except UsageError as exc:
        raise InvalidRequestError(exc.message, "messages") from exc
    return {"prompt": strip_bos(prompt, engine.bos_token, engine.add_bos)}


async def handle(table: ModelTable, raw: bytes) -> dict[str, str]:
    body = json_object(raw)
    model = await table.ready(body.get("model"))
    return await run_in_threadpool(apply_template, model, body)
