"""`localrun logs` shown: the runs as a table, one run in full, the figures
per group, a comparison of two groups, and tokens/sec over time as SVG."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from localrun.history.query import GroupStats, change
from localrun.ui.svgchart import Series, line_chart
from localrun.ui.table import Column, FitTable


def when(timestamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp)) if timestamp is not None else "-"


def _num(value: Any, fmt: str = ".1f", suffix: str = "") -> str:
    return f"{value:{fmt}}{suffix}" if isinstance(value, int | float) else "-"


def _snippet(text: str | None, width: int = 48) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _acceptance(drafted: Any, accepted: Any) -> str:
    return f"{accepted / drafted:.0%}" if drafted else "-"


# the ID (what `logs show` and `logs rm` take) and the model are never cut;
# the others go, least useful first, when the terminal is too narrow
RUN_COLUMNS = (
    Column("ID", "right"),
    Column("WHEN", drop=4),
    Column("COMMAND", drop=1),
    Column("MODEL"),
    Column("KV", drop=6),
    Column("DRAFT", drop=7),
    Column("TOKENS", "right", drop=5),
    Column("TOK/S", "right", drop=2),
    Column("TTFT", drop=8),
    Column("P95 MS/TOK", drop=9),
    Column("PROMPT", wrap=16, drop=3, one_line=True),
)


def runs_table(rows: Sequence[dict[str, Any]]) -> FitTable:
    table = FitTable(RUN_COLUMNS, box=None, pad_edge=False)
    for r in rows:
        drafter = r["drafter"] or r["draft"] or "-"
        if r["drafted"]:
            drafter += f" {_acceptance(r['drafted'], r['accepted'])}"
        table.add_row(
            str(r["id"]),
            when(r["time"]),
            r["command"] + (f" #{r['conversation_id']}" if r["conversation_id"] else ""),
            r["model"] or "-",
            r["kv"] or "-",
            drafter,
            str(r["generated_tokens"] if r["generated_tokens"] is not None else "-"),
            _num(r["decode_tps"]),
            _num(r["ttft_s"], ".2f", "s"),
            _num(r["token_p95_ms"], ".0f"),
            _snippet(r["prompt"]),
        )
    return table


_SHOW_ORDER = (
    "time",
    "command",
    "conversation_id",
    "model",
    "model_file",
    "model_sha256",
    "remote",
    "cpu",
    "kv",
    "flash_attn",
    "draft",
    "drafter",
    "ctx",
    "threads",
    "thread_shares",
    "parallel",
    "schema",
    "prompt_tokens",
    "cached_tokens",
    "generated_tokens",
    "ttft_s",
    "prompt_tps",
    "decode_tps",
    "token_p50_ms",
    "token_p95_ms",
    "drafted",
    "accepted",
    "elapsed_s",
    "stop_reason",
    "valid",
    "exit_status",
)


def _setting_text(value: Any) -> str:
    """A setting's value as the options write it: null is automatic, a flag on or off."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _settings_lines(settings: dict[str, Any]) -> list[str]:
    lines = []
    for name, setting in settings.items():
        if isinstance(setting, dict):
            why = f" ({setting['why']})" if setting.get("why") else ""
            lines.append(f"    {name}: {_setting_text(setting.get('value'))} [{setting.get('source')}]{why}")
    return lines


def run_text(r: dict[str, Any]) -> str:
    """One run in full: its fields, the settings with their sources, then the texts."""
    lines = [f"run {r['id']}"]
    for name in _SHOW_ORDER:
        value = r.get(name)
        if value is None:
            continue
        if name == "time":
            value = when(value)
        elif name == "valid":  # kept as 0 or 1
            value = "yes" if value else "no"
        elif isinstance(value, float):
            value = f"{value:.4g}"
        lines.append(f"  {name}: {value}")
    if r.get("drafted"):
        lines.append(f"  acceptance: {_acceptance(r['drafted'], r['accepted'])}")
    if r.get("settings"):
        lines += ["  settings:", *_settings_lines(json.loads(r["settings"]))]
    for name in ("system", "prompt", "response"):
        if r.get(name):
            lines.append(f"\n{name}:\n{r[name]}")
    return "\n".join(lines)


def _label(key: tuple[str, ...]) -> str:
    return ", ".join(key) or "all runs"


def stats_table(by: Sequence[str], groups: Sequence[GroupStats]) -> FitTable:
    figures = (("RUNS", 0), ("TOK/S P50", 0), ("MS/TOK P95", 3), ("TTFT P50", 2), ("TTFT P95", 4), ("ACCEPT", 1))
    columns = [*(Column(b.upper()) for b in by), *(Column(name, "right", drop=drop) for name, drop in figures)]
    table = FitTable(columns, box=None, pad_edge=False)
    for g in groups:
        s = g.summary()
        table.add_row(
            *g.key,
            str(s["runs"]),
            _num(s["decode_tokens_per_s_p50"]),
            _num(s["p95_token_ms_p95"], ".0f"),
            _num(s["ttft_s_p50"], ".2f", "s"),
            _num(s["ttft_s_p95"], ".2f", "s"),
            _num(s["acceptance"], ".0%"),
        )
    return table


COMPARED = (
    ("runs", "runs", "d", ""),
    ("decode_tokens_per_s_p50", "tok/s p50", ".1f", ""),
    ("p95_token_ms_p95", "ms/tok p95", ".1f", ""),
    ("ttft_s_p50", "ttft p50", ".2f", "s"),
    ("ttft_s_p95", "ttft p95", ".2f", "s"),
    ("acceptance", "acceptance", ".0%", ""),
)


def _change(name: str, before: Any, after: Any) -> float | None:
    """Relative for the figures; acceptance, itself a ratio, changes by the difference."""
    if name == "acceptance":
        return after - before if before is not None and after is not None else None
    return change(before, after)


def comparison(a_label: str, b_label: str, a: GroupStats, b: GroupStats) -> dict[str, Any]:
    """Both sides' figures and the change from the first to the second, for --json."""
    first, second = a.summary(), b.summary()
    return {
        "a": {"select": a_label, **first},
        "b": {"select": b_label, **second},
        "change": {name: _change(name, first[name], second[name]) for name, *_ in COMPARED if name != "runs"},
    }


def compare_table(a_label: str, b_label: str, a: GroupStats, b: GroupStats) -> Table:
    result = comparison(a_label, b_label, a, b)
    table = Table(box=None, pad_edge=False)
    table.add_column("")
    for col in (a_label, b_label, "CHANGE"):
        table.add_column(col, justify="right")
    for name, label, fmt, suffix in COMPARED:
        delta = result["change"].get(name)
        table.add_row(
            label,
            _num(result["a"][name], fmt, suffix),
            _num(result["b"][name], fmt, suffix),
            "-" if delta is None else f"{delta * 100:+.1f} pt" if name == "acceptance" else f"{delta:+.1%}",
        )
    return table


def chart(by: Sequence[str], lines: dict[tuple[str, ...], list[tuple[float, float, int]]]) -> str:
    """Tokens/sec over time, one line per group, as an SVG document."""
    series = [Series(_label(key), [(t, rate) for t, rate, _ in points]) for key, points in lines.items()]
    first = min((p[0] for s in series for p in s.points), default=0.0)
    last = max((p[0] for s in series for p in s.points), default=0.0)
    subtitle = f"median decode tokens/sec per time bin, {when(first)} to {when(last)}"
    if by:
        subtitle += f"; one line per {', '.join(by)}"
    return line_chart("localrun run history", subtitle, series, unit="tokens/sec", x_label=when)
