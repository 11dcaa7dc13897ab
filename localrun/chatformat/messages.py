"""The changes a family's llama.cpp handler makes to a conversation before
its template renders it (common/chat.cpp): gpt-oss and LFM2's ``thinking``
field, Ministral's content blocks, DeepSeek V4's tool results in call
order, Gemma 4's tool responses inside the calling turn, StepFun's trimmed
contents. Each takes the messages already in llama.cpp's shape."""

from __future__ import annotations

import json
from typing import Any

Json = dict[str, Any]


def unchanged(messages: list[Json], source: str) -> list[Json]:
    return messages


def thinking_field(messages: list[Json], source: str) -> list[Json]:
    """``reasoning_content`` copied to ``thinking``, the field LFM2's templates read."""
    for m in messages:
        if isinstance(m.get("reasoning_content"), str):
            m["thinking"] = m["reasoning_content"]
    return messages


def harmony_thinking(messages: list[Json], source: str) -> list[Json]:
    """gpt-oss: ``thinking`` as LFM2's, and no content beside a call."""
    for m in thinking_field(messages, source):
        if "thinking" in m and m.get("tool_calls"):
            m.pop("content", None)
    return messages


def ministral_blocks(messages: list[Json], source: str) -> list[Json]:
    """Ministral 3: system and assistant contents as blocks, the thinking one of them."""
    return [_blocks(m) for m in messages]


def _blocks(message: Json) -> Json:
    if message.get("role") not in ("system", "assistant"):
        return message
    blocks: list[Json] = []
    if isinstance(message.get("reasoning_content"), str):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"]})
    content = message.get("content")
    if isinstance(content, str):
        blocks.append({"type": "text", "text": content})
    elif isinstance(content, list):
        blocks.extend(content)
    adjusted = dict(message)
    adjusted["content"] = blocks
    adjusted.pop("reasoning_content", None)
    return adjusted


def trimmed(message: Json) -> Json:
    """StepFun's templates get their contents without surrounding whitespace."""
    if isinstance(message.get("content"), str):
        message["content"] = message["content"].strip(" \t\n\r")
    elif isinstance(message.get("content"), list):
        for part in message["content"]:
            if part["type"] == "text":
                part["text"] = part["text"].strip(" \t\n\r")
    if "reasoning_content" in message:
        message["reasoning_content"] = message["reasoning_content"].strip(" \t\n\r")
        if not message["reasoning_content"]:
            del message["reasoning_content"]
    return message


def results_in_call_order(messages: list[Json], source: str) -> list[Json]:
    """DeepSeek V4 renders a run of tool results in the order of the calls they answer."""
    order: dict[str, int] = {}
    i = 0
    while i < len(messages):
        role = messages[i].get("role")
        if role == "assistant" and messages[i].get("tool_calls"):
            order = {c["id"]: n for n, c in enumerate(messages[i]["tool_calls"]) if c.get("id")}
            i += 1
            continue
        if role not in ("user", "tool"):
            i += 1
            continue
        end = i
        while end < len(messages) and messages[end].get("role") in ("user", "tool"):
            end += 1
        positions = [p for p in range(i, end) if messages[p].get("role") == "tool"]
        if len(positions) > 1 and order:
            results = sorted((messages[p] for p in positions), key=lambda m: order.get(m.get("tool_call_id", ""), 0))
            for p, result in zip(positions, results, strict=True):
                messages[p] = result
        i = end
    return messages


def gemma4_tool_responses(messages: list[Json], source: str) -> list[Json]:
    """Older Gemma 4 templates take tool results inside the assistant turn
    that called them (the newer read OpenAI's shape themselves)."""
    if "{#- OpenAI Chat Completions:" in source:
        return messages
    result: list[Json] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            result.append(m)
            i += 1
            continue
        calls = m["tool_calls"]
        responses: list[Json] = []
        i += 1
        while i < len(messages) and messages[i].get("role") == "tool":
            content = messages[i].get("content")
            response: Any = content
            if isinstance(content, str):
                try:
                    response = json.loads(content)
                except json.JSONDecodeError:
                    response = content
            name = calls[len(responses)]["function"].get("name", "") if len(responses) < len(calls) else ""
            responses.append({"name": name or messages[i].get("tool_call_id", ""), "response": response})
            i += 1
        turn: Json = {"role": "assistant", "tool_calls": calls}
        if responses:
            turn["tool_responses"] = responses
        answer = messages[i] if i < len(messages) else {}
        if answer.get("role") == "assistant" and not answer.get("tool_calls") and answer.get("content"):
            turn["content"] = answer["content"]  # the answer after the results joins the turn
            i += 1
        if isinstance(m.get("reasoning_content"), str):
            turn["reasoning_content"] = m["reasoning_content"]
        result.append(turn)
    return result


def as_rendered(prompt: str, add_generation_prompt: bool) -> str:
    return prompt


def gemma4_model_turn(prompt: str, add_generation_prompt: bool) -> str:
    """llama.cpp opens the model's turn after a call and its results."""
    if add_generation_prompt and prompt.endswith("<turn|>\n"):
        return prompt + "<|turn>model\n"
    return prompt


def harmony_history(prompt: str, add_generation_prompt: bool) -> str:
    """A finished gpt-oss answer ends as a turn in history does."""
    if add_generation_prompt:
        return prompt
    head, found, tail = prompt.rpartition("<|return|>")
    return head + "<|end|>" + tail if found else prompt
