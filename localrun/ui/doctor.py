"""`localrun doctor` as lines of text."""

from __future__ import annotations

from localrun.doctor import DefaultModel, Report, Speed
from localrun.units import human_bytes


def _flags(flags: tuple[tuple[str, str], ...]) -> str:
    return " ".join(k if v == "1" else f"{k}={v}" for k, v in flags if v != "0")


def _rate(label: str, value: float | None) -> str | None:
    return f"{label} {value:.1f}" if value is not None else None


def _speed(speed: Speed) -> str:
    parts = [
        _rate("decode", speed.decode),
        _rate("prompt", speed.prompt),
        _rate("--batch", speed.batch),
    ]
    rates = ", ".join(p for p in parts if p) or "no rates"
    return f"{rates} tokens/s (KV {speed.kv}, measured {speed.measured_at})"


def _where(place: str, why: str) -> str:
    """Where the model runs, and why, saying the place once: the placement's
    reason starts with it ("CPU: no GPU in this build or machine")."""
    if not why:
        return place
    return why if why == place or why.startswith(f"{place}: ") else f"{place}: {why}"


def _model(model: DefaultModel) -> list[str]:
    lines = [f"default model  {model.name}" + (f"  {model.path}" if model.path else "")]
    if model.placement is not None:
        reasons = dict(model.placement.reasons)
        lines.append(f"  runs on      {_where(model.placement.model.describe(), reasons.get('model', ''))}")
        if model.placement.budget:
            lines.append(f"  budget       {human_bytes(model.placement.budget)} ({reasons.get('budget', '')})")
    if model.speed is not None:
        lines.append(f"  speed here   {_speed(model.speed)}")
    if model.note:
        lines.append(f"  note         {model.note}")
    return lines


def describe(report: Report) -> str:
    lines = [f"llama.cpp      llama-cpp-python {report.version}, " + ("GPU build" if report.gpu_build else "CPU build")]
    for backend in report.backends:
        lines.append(f"  {backend.name:<12} {_flags(backend.flags)}".rstrip())
    lines.append("devices")
    for d in report.devices:
        memory = f"{human_bytes(d.free)} free of {human_bytes(d.total)}" if d.total else "memory unknown"
        lines.append(f"  {d.name:<12} {'rpc' if d.remote else d.kind:<5} {memory}  {d.description}".rstrip())
    if report.rpc_devices:
        servers = ", ".join(f"{d.name} on {d.description}" for d in report.rpc_devices)
        lines.append(
            f"rpc            {servers}: for a model larger than one machine's memory; "
            "each step's activations cross the network, so on one machine it is slower than the CPU alone"
        )
    lines += _model(report.model)
    if report.hint:
        lines.append(f"hint: {report.hint}")
    return "\n".join(lines)
