"""From a parsed request to what the scheduler runs: the prompt's tokens
(the chat template as `localrun chat` applies it, or the raw text), the
sampling settings, the limit, the stop strings and the output constraint."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from localrun.errors import ContextOverflowError, InvalidRequestError, UsageError
from localrun.runtime.batch.scheduler import BatchRequest
from localrun.runtime.prompt import Prompt, render_messages, reply_start, stable_prefix, tokenize_rendered
from localrun.runtime.reasoning import reasoning_for, switches_for
from localrun.runtime.sampling import SamplingParams
from localrun.serve.schemas import ChatRequest, CompletionRequest
from localrun.serve.schemas import Message as ChatMessage
from localrun.serve.served import ServedModel
from localrun.serve.tools import ToolUse, conversation, tool_use
from localrun.structured.constraint import tokenizer_for
from localrun.structured.spec import OutputSpec, response_format
from localrun.structured.tools import tool_grammar

ROLES = {"developer": "system"}  # OpenAI's newer name for the system role
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
    "seed",
    "frequency_penalty",
    "presence_penalty",
)


def sampling(request: ChatRequest | CompletionRequest, n_vocab: int, n_ctx: int) -> SamplingParams:
    """The request's sampling settings; what it leaves out is `localrun generate`'s default
    (``repeat_last_n`` -1: the penalties look back over the whole context, ``n_ctx``)."""
    fields = SAMPLING_FIELDS
    given = {name: getattr(request, name) for name in fields if getattr(request, name) is not None}
    if given.get("repeat_last_n") == -1:
        given["repeat_last_n"] = n_ctx
    return replace(SamplingParams(), **given, logit_bias=request.biases(n_vocab))


def _message(m: ChatMessage) -> dict[str, Any]:
    message: dict[str, Any] = {"role": ROLES.get(m.role, m.role), "content": m.text()}
    if m.tool_calls:
        message["tool_calls"] = [c.model_dump() for c in m.tool_calls]
    if m.tool_call_id is not None:
        message["tool_call_id"] = m.tool_call_id
    if m.reasoning_content:
        message["reasoning_content"] = m.reasoning_content
    return message


def switches(template: str, request: ChatRequest) -> dict[str, Any]:
    """The template switches a request asks for: ``reasoning_effort`` (as is
    where the template reads it, else "none" turns thinking off where it has
    a switch; without it, the template's default as llama-server renders it),
    then ``chat_template_kwargs`` as given."""
    effort = request.reasoning_effort
    out = switches_for(template, "auto")
    if effort is not None:
        if "reasoning_effort" in template:
            out["reasoning_effort"] = "low" if effort in ("none", "minimal") else effort
        else:
            out = switches_for(template, "off" if effort == "none" else "on")
    return out | (request.chat_template_kwargs or {})


def chat_prompt(model: ServedModel, request: ChatRequest, use: ToolUse | None = None) -> Prompt:
    """The conversation's tokens, and how many of them stand for its system prompt."""
    if model.template is None:
        raise InvalidRequestError(
            f"{model.id} has no chat template: use /v1/completions, or start the server with --template", "messages"
        )
    messages = [_message(m) for m in request.messages]
    if model.system and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": model.system})
    if any(m["role"] == "tool" or "tool_calls" in m for m in messages) or use is not None:
        messages = conversation(messages, use)
    offered = use.declared if use is not None and use.native and use.choice is not None else None
    asked = switches(model.template, request)
    full = render_messages(model.engine, model.template, messages, offered, asked)
    tokens = tokenize_rendered(model.engine, full)
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
    mark = None
    if model.loaded.recurrent:  # the conversation's next request restores a checkpoint there
        mark = reply_start(model.engine, model.template, messages, full, tokens, asked, offered)
    shared = stable_prefix(model.engine, full, tokens, system, templated=True)
    return Prompt(tokens, shared, full, (mark,) if mark else ())


def completion_prompt(model: ServedModel, request: CompletionRequest) -> list[int]:
    prompt = request.prompt
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        tokens = [int(t) for t in prompt]
        if any(not 0 <= t < model.engine.n_vocab for t in tokens):
            raise InvalidRequestError(f"prompt: token ids run from 0 to {model.engine.n_vocab - 1}", "prompt")
        return tokens
    text = prompt if isinstance(prompt, str) else str(prompt[0]) if prompt else ""
    return model.engine.tokenize(text, add_special=model.engine.add_bos)


def output_spec(
    model: ServedModel, request: ChatRequest | CompletionRequest, use: ToolUse | None = None
) -> OutputSpec | None:
    """The reply's constraint: the tools' grammar or the ``response_format``'s,
    built where the model is loaded (a runner keeps the grammar library out
    of the server's process: nothing of it stays after the model unloads)."""
    wanted: dict[str, Any]
    if use is not None and use.choice is not None:
        if request.response_format is not None:
            raise InvalidRequestError("response_format and tools together are not supported", "response_format")
        if use.family.grammar is None:  # a family whose calls are read, not constrained
            return None
        budget = request.reasoning_budget_tokens if isinstance(request, ChatRequest) else None
        wanted = {"tools": (use.functions, use.family.grammar, use.choice, use.parallel, budget)}
    elif request.response_format is None:
        return None
    else:
        wanted = {"response_format": request.response_format}
    spec: OutputSpec | None = model.call_blocking(_built_output, wanted)["spec"]
    return spec


def _built_output(model: ServedModel, wanted: dict[str, Any]) -> dict[str, Any]:
    """`output_spec`'s constraint, where the model is loaded, with its tokenizer
    built once per engine here rather than on the engine thread."""
    spec: OutputSpec | None
    if "tools" in wanted:
        functions, fmt, choice, parallel, budget = wanted["tools"]
        spec = tool_grammar(model.engine, functions, fmt, choice, parallel=parallel, budget=budget)
    else:
        try:
            spec = response_format(wanted["response_format"])
        except UsageError as exc:
            raise InvalidRequestError(exc.message, "response_format") from None
    if spec is not None:
        tokenizer_for(model.engine)
    return {"spec": spec}


def prepare(
    model: ServedModel, request: ChatRequest | CompletionRequest, index: int
) -> tuple[BatchRequest, ToolUse | None]:
    """The scheduler's request (and the request's tools, if any), or an error
    naming the field: a prompt that does not fit its slot gets the numbers
    (nothing is cut silently)."""
    use = None
    reasoning = None
    if isinstance(request, ChatRequest):
        use = tool_use(request.tools, request.tool_choice, request.parallel_tool_calls, model.template)
        prompt = chat_prompt(model, request, use)
        if request.reasoning_format != "none":  # "none": the thinking stays in the content, markers and all
            reasoning = reasoning_for(model.template, prompt.text, budget=request.reasoning_budget_tokens)
    else:
        prompt = Prompt(completion_prompt(model, request), 0)
    tokens = prompt.tokens
    if not tokens:
        raise InvalidRequestError("the prompt is empty", "messages" if isinstance(request, ChatRequest) else "prompt")
    if len(tokens) >= model.capacity:
        raise ContextOverflowError(
            f"the prompt is {len(tokens)} tokens; each slot's context holds {model.capacity}",
            hint="shorten it, or start the server with a larger --ctx",
            n_prompt=len(tokens),
            n_ctx=model.capacity,
        )
    return BatchRequest(
        index=index,
        tokens=tokens,
        sampling=sampling(request, model.engine.n_vocab, model.capacity),
        max_tokens=request.limit(),
        stop=request.stops(),
        output=output_spec(model, request, use),
        shared=prompt.shared,
        reasoning=reasoning,
        logprobs=request.top_logprobs_wanted(),
        preserved=use.family.preserved if use is not None else (),
        marks=prompt.marks,
    ), use
