"""Every family localrun knows, in the order a template is matched against
them (as llama.cpp's common/chat.cpp tries its handlers: the most particular
markers first), and `of`, the one place a template's family is decided.
A new family is one entry here."""

from __future__ import annotations

import dataclasses
import functools

from localrun.chatformat import messages, thinking
from localrun.chatformat.format import ChatFormat
from localrun.structured.toolcalls import families as calls

_QWEN3_CODER = ("<tool_call>", "<function=", "<parameter=")

FORMATS: tuple[ChatFormat, ...] = (
    # the families llama.cpp gives a handler of their own, in the order it tries them
    ChatFormat(
        "ministral3",
        ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]"),
        ("[CALL_ID]",),
        tools=calls.MISTRAL_FAMILY,
        prepare=messages.ministral_blocks,
        note="Ministral 3, Devstral",
    ),
    ChatFormat(
        "gpt-oss",
        ("<|channel|>",),
        tools=calls.HARMONY_FAMILY,
        thinks=(thinking.HARMONY, *thinking.TAGGED),
        prepare=messages.harmony_thinking,
        finish=messages.harmony_history,
        keeps_developer=True,
        note="gpt-oss (harmony)",
    ),
    ChatFormat("muse-glimmer", ("<atem:function_calls>", "<|eom|>"), tools=calls.MUSE_FAMILY, note="Muse Glimmer"),
    ChatFormat(
        "functionary-v3.2", (">>>all", ">>>${recipient}"), tools=calls.FUNCTIONARY_V32_FAMILY, note="Functionary v3.2"
    ),
    ChatFormat(
        "kimi-k2", ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"), tools=calls.KIMI_K2_FAMILY, note="Kimi K2"
    ),
    ChatFormat(
        "kimi-k3",
        ("<|open|>", "<|close|>", "<|end_of_msg|>"),
        tools=calls.KIMI_K3_FAMILY,
        thinks=(thinking.KIMI_K3,),
        note="Kimi K3",
    ),
    ChatFormat("ling3", ("<role>ASSISTANT</role>", "<arg_key>"), tools=calls.GLM_FAMILY, note="Ling 3"),
    ChatFormat(
        "cohere2moe",
        ("<|START_TEXT|>", "<|START_ACTION|>"),
        tools=calls.COMMAND_R_FAMILY,
        note="Command A (Cohere2 MoE)",
    ),
    ChatFormat(
        "lfm2",
        ("<|tool_list_start|>", "<|tool_list_end|>"),
        tools=calls.LFM2_FAMILY,
        prepare=messages.thinking_field,
        note="LFM2",
    ),
    ChatFormat(
        "lfm2.5",
        ("List of tools: [",),
        ("<|tool_list_start|>",),
        tools=calls.LFM2_FAMILY,
        prepare=messages.thinking_field,
        note="LFM2.5",
    ),
    ChatFormat(
        "gigachat-v3",
        ("<|role_sep|>", "<|message_sep|>"),
        ("<|function_call|>",),
        tools=calls.GIGACHAT_V3_FAMILY,
        note="GigaChat 3",
    ),
    ChatFormat(
        "minimax-m3",
        ("]<]minimax[>[", "<tool_call>", "<invoke name="),
        tools=calls.MINIMAX_M3_FAMILY,
        note="MiniMax M3",
    ),
    ChatFormat(
        "deepseek-v3.2", ("dsml_token", "DSML", "function_calls"), tools=calls.DSML_V32_FAMILY, note="DeepSeek V3.2"
    ),
    ChatFormat(
        "deepseek-v4",
        ("dsml_token", "DSML", "tool_calls"),
        ("function_calls",),
        tools=calls.DSML_V4_FAMILY,
        prepare=messages.results_in_call_order,
        note="DeepSeek V4",
    ),
    ChatFormat(
        "gemma4",
        ("'<|tool_call>call:'",),
        tools=calls.GEMMA4_FAMILY,
        prepare=messages.gemma4_tool_responses,
        finish=messages.gemma4_model_turn,
        note="Gemma 4",
    ),
    ChatFormat(
        "minicpm5",
        ("Tool usage guidelines:", '<function name="', '<param name="'),
        tools=calls.MINICPM_FAMILY,
        nested_arguments=False,
        note="MiniCPM 5",
    ),
    ChatFormat(
        "stepfun",
        ("You have access to the following functions in JSONSchema format", *_QWEN3_CODER),
        tools=calls.QWEN3_CODER_FAMILY,
        trims=True,
        note="StepFun 3.5",
    ),
    ChatFormat(
        "qwen3-coder",
        _QWEN3_CODER,
        ("'<tool_call><function=' ~ tool_call.name ~ '>'",),
        tools=calls.QWEN3_CODER_FAMILY,
        note="Qwen3-Coder, Qwen3.5, Nemotron 3 Nano",
    ),
    # the families llama.cpp reads with a generic parser, or with a handler chosen by the calls' markers
    ChatFormat(
        "gigachat-v3.1", ("<|function_call|>", "<|message_sep|>"), tools=calls.GIGACHAT_V31_FAMILY, note="GigaChat 3.1"
    ),
    ChatFormat("command-r7b", ("<|START_ACTION|>", "<|END_ACTION|>"), tools=calls.COMMAND_R_FAMILY, note="Command R7B"),
    ChatFormat("glm", ("<arg_key>", "<arg_value>"), tools=calls.GLM_FAMILY, note="GLM 4.5 to 4.7, Laguna, Spark"),
    ChatFormat("hunyuan", ("<tool_sep{}>", ":opensource"), tools=calls.HUNYUAN_FAMILY, note="Hunyuan 3"),
    ChatFormat(
        "command-r-plus",
        ("<|START_OF_TURN_TOKEN|>", "Action:"),
        tools=calls.COMMAND_R_PLUS_FAMILY,
        note="Command R+",
    ),
    ChatFormat("minimax-m2", ("<minimax:tool_call>",), tools=calls.MINIMAX_M2_FAMILY, note="MiniMax M2"),
    ChatFormat("minimax-m1", ("<tool_calls>", "<end_of_sentence>"), tools=calls.MINIMAX_M1_FAMILY, note="MiniMax M1"),
    ChatFormat("apriel", ("<tool_calls>", "<available_tools>"), tools=calls.APRIEL_FAMILY, note="Apriel 1.5, 1.6"),
    ChatFormat("nemotron-v2", ("<TOOLCALL>",), tools=calls.NEMOTRON_FAMILY, note="Nemotron Nano 2"),
    ChatFormat("seed-oss", ("<seed:tool_call>",), tools=calls.SEED_FAMILY, note="Seed-OSS"),
    ChatFormat("apertus", ("<|tools_prefix|>",), tools=calls.APERTUS_FAMILY, note="Apertus"),
    ChatFormat("solar-open", ("<|tool_call:begin|>",), tools=calls.SOLAR_FAMILY, note="Solar Open"),
    ChatFormat("firefunction-v2", ("functools[",), tools=calls.FIREFUNCTION_FAMILY, note="FireFunction v2"),
    ChatFormat(
        "functionary-v3.1",
        ("<function=", "<|python_tag|>"),
        tools=calls.FUNCTIONARY_V31_FAMILY,
        note="Functionary v3.1",
    ),
    ChatFormat("mistral", ("[TOOL_CALLS]", "[ARGS]"), tools=calls.MISTRAL_FAMILY, note="Mistral Small 3.2"),
    ChatFormat("mistral-nemo", ("[TOOL_CALLS]",), tools=calls.MISTRAL_NEMO_FAMILY, note="Mistral Nemo"),
    ChatFormat(
        "deepseek-r1",
        ("tool▁calls▁begin", "```json"),
        tools=calls.DEEPSEEK_R1_FAMILY,
        note="DeepSeek R1 and its distills",
    ),
    ChatFormat("deepseek-v3.1", ("tool▁calls▁begin",), tools=calls.DEEPSEEK_V31_FAMILY, note="DeepSeek V3, V3.1"),
    ChatFormat("granite", ("<|tool_call|>",), tools=calls.GRANITE_FAMILY, note="Granite 3"),
    ChatFormat("llama3", ("<|python_tag|>",), tools=calls.LLAMA3_FAMILY, note="Llama 3.1, 3.3"),
    ChatFormat(
        "llama3.2", ('{"name": function name, "parameters":',), tools=calls.LLAMA3_FAMILY, note="Llama 3.2 (JSON calls)"
    ),
)
# a template matching none: Hermes' <tool_call> (what localrun describes tools
# in to a template that takes none), its thinking by the tags it holds
HERMES = ChatFormat("hermes", note="Hermes, Qwen2.5, Qwen3, and any other template")


def named(name: str) -> ChatFormat:
    """The family called ``name`` (as `ChatFormat.name`)."""
    return next(fmt for fmt in (*FORMATS, HERMES) if fmt.name == name)


@functools.lru_cache(maxsize=64)
def _of(template: str) -> ChatFormat:
    fmt = next((fmt for fmt in FORMATS if fmt.matches(template)), HERMES)
    return dataclasses.replace(fmt, reasoning=thinking.found(template, fmt.thinks))


def of(template: str | None) -> ChatFormat:
    """The chat format of ``template`` (decided once per template text): its
    family's entry with the reasoning markers the template holds. No
    template (a raw prompt) is Hermes' format without thinking."""
    return _of(template) if template else HERMES
