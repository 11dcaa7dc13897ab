"""Structured output: text that must follow a JSON Schema or a grammar.

- `spec`: `--schema` (JSON Schema inline, in a file, or the concise form) and
  `--grammar` (GBNF or Lark) become an `OutputSpec`, checked before any model
  loads.
- `constraint`: llguidance masks the logits at every step so that only
  tokens the grammar accepts can be sampled, with a tokenizer built from the
  model's own vocabulary; the result is validated against the schema.
- `tools`: the grammar for tool calls; `toolcalls`: each model family's call
  format, told from its chat template, and a reply split into its content and
  its checked calls (whole, or as it streams).
"""
