"""Wisdom: the speed settings measured on this machine for one model, kept in
the cache directory (`wisdom.json`) and read by every default that depends
on speed.

An entry belongs to a key: this `Machine` (CPU model and flags, CPU count,
llama.cpp build), the model file (name and size) and the KV cache types it
was measured with. An entry of another key decides nothing; a file that
cannot be read is ignored with a warning, never a crash.

Each setting is a `Decision`: the value chosen, or None where the candidates
measured as a tie (then llama.cpp's default is kept), with the figures behind
it. The settings that interact, the KV cache types and flash attention, are
kept as `Rates` instead: for each combination measured, how fast it fills a
prompt and decodes at a few depths. Which one a run takes depends on the
run's shape (`RunShape`: its prompt and its answer), so it is chosen for each
run (`Rates.pick`, from `localrun.tune.apply`), never once for all.

Version 2 added the rates. A version-1 file still loads; its entries have no
rates, so their KV types are chosen for capacity alone (their KV race ran
every type with flash attention on, and never weighed the prompt) until
`localrun tune` measures the model again.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from localrun import paths
from localrun.tune.machine import Machine, this_machine

VERSION = 2
READABLE = (1, 2)  # the versions `WisdomFile.load` reads (1: no rates)
TIE_MARGIN = 0.03  # candidates closer than this share of the better one's figure are a tie
MAX_GAIN = 2.5  # a setting measured this many times faster than llama.cpp's default is a red flag, not a result
VERIFY_DEPTH = 32  # the tokens a context holds where `localrun tune` measures the verify curve
# the fields each phase of `localrun tune` measures (localrun.tune.measure)
PHASE_FIELDS: dict[str, tuple[str, ...]] = {
    "threads": ("threads",),
    "verify": ("verify_ms",),
    "parallel": ("parallel",),
    "ubatch": ("n_ubatch",),
    "depth": ("flash_attn", "kv_cost", "kv_depth", "rates"),
}


def wisdom_file() -> Path:
    return paths.cache_dir() / "wisdom.json"


@dataclass(frozen=True)
class ModelKey:
    file: str  # the file's name
    size: int  # and size in bytes

    @classmethod
    def of(cls, path: Path) -> ModelKey:
        return cls(path.name, path.stat().st_size)


def kv_label(type_k: str, type_v: str) -> str:
    return f"{type_k}/{type_v}"


@dataclass(frozen=True)
class Decision:
    """A setting chosen by measurement. ``value`` None: a tie, llama.cpp's
    default kept. ``figures``: the measured figure per candidate (its label),
    in ``unit``; ``better`` says which way is better."""

    value: int | str | None
    figures: Mapping[str, float]
    unit: str
    better: str = "lower"  # or "higher"
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "figures": dict(self.figures),
            "unit": self.unit,
            "better": self.better,
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Decision:
        if not isinstance(raw, dict) or not isinstance(raw.get("figures"), dict):
            raise ValueError("a decision lacks its figures")
        value = raw.get("value")
        if value is not None and not isinstance(value, int | str):
            raise ValueError(f"a decision's value {value!r} is not a number or a name")
        return cls(
            value=value,
            figures={str(k): float(v) for k, v in raw["figures"].items()},
            unit=str(raw.get("unit", "")),
            better=str(raw.get("better", "lower")),
            note=str(raw.get("note", "")),
        )


def _fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares y = a + b x (b = 0 with one distinct x)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


@dataclass(frozen=True)
class Attention:
    """Decode step time (ms) with flash attention off and on, at context depths."""

    depths: tuple[int, ...]
    off_ms: tuple[float, ...]
    on_ms: tuple[float, ...]
    noise: float = 0.0  # the measurements' typical spread, as a share: a difference within it is a tie

    def predicted(self, mode: str, depth: float) -> float:
        a, b = _fit(self.depths, self.off_ms if mode == "off" else self.on_ms)
        return a + b * depth

    def choice(self, depth: float | None = None, max_gain: float | None = MAX_GAIN) -> str | None:
        """The faster mode at ``depth`` (None: the middle of the depths
        measured); None when they are within the tie margin or the noise, or
        one is more than ``max_gain`` times as fast as the other (None: no
        bound, for steps of attention alone, as `localrun.tune.attention` times)."""
        if depth is None:
            depth = sum(self.depths) / len(self.depths)
        depth = min(depth, 4 * max(self.depths))  # a line says little far beyond what was measured
        off, on = self.predicted("off", depth), self.predicted("on", depth)
        if abs(off - on) <= max(TIE_MARGIN, self.noise) * min(off, on):
            return None  # a tie: llama.cpp's auto
        if max_gain is not None and max(off, on) > max_gain * min(off, on):
            return None  # a gain no setting gives to a whole step (the machine was busy): llama.cpp's auto
        return "off" if off < on else "on"

    @property
    def crossover(self) -> int | None:
        """The depth where the two lines cross, if it lies beyond 0."""
        a0, b0 = _fit(self.depths, self.off_ms)
        a1, b1 = _fit(self.depths, self.on_ms)
        if b0 == b1:
            return None
        x = (a1 - a0) / (b0 - b1)
        return round(x) if x > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "depths": list(self.depths),
            "off_ms": [round(x, 3) for x in self.off_ms],
            "on_ms": [round(x, 3) for x in self.on_ms],
            "noise": self.noise,
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Attention:
        depths = tuple(int(d) for d in raw["depths"])
        off, on = tuple(float(x) for x in raw["off_ms"]), tuple(float(x) for x in raw["on_ms"])
        if not depths or len(off) != len(depths) or len(on) != len(depths):
            raise ValueError("flash attention figures do not match their depths")
        return cls(depths, off, on, float(raw.get("noise", 0.0)))


def setting_label(type_k: str, type_v: str, flash_attn: str) -> str:
    """A KV-types and flash-attention combination as the rates name it: "f16/f16 fa off"."""
    return f"{type_k}/{type_v} fa {flash_attn}"


def parse_setting(label: str) -> tuple[str, str, str]:
    """(type_k, type_v, flash attention) of a `setting_label`."""
    kv, _, mode = label.partition(" fa ")
    type_k, _, type_v = kv.partition("/")
    if not type_k or not type_v or mode not in ("on", "off"):
        raise ValueError(f"{label!r} is not a KV and flash-attention setting")
    return type_k, type_v, mode


@dataclass(frozen=True)
class RunShape:
    """What a run does, for choosing its settings: ``prompt`` tokens filled
    after ``start`` tokens the context already holds (a chat's earlier
    turns), then ``answer`` tokens decoded. ``what``: how it was guessed,
    for the reason shown."""

    prompt: int
    answer: int
    start: int = 0
    what: str = ""

    def describe(self) -> str:
        held = f" after {self.start:,} held" if self.start else ""
        text = f"{self.prompt:,}-token prompt{held} and {self.answer:,}-token answer"
        return f"{text} ({self.what})" if self.what else text


def _rising(depths: Sequence[float], ms: Sequence[float]) -> tuple[float, float]:
    """A line of cost over depth that never falls (attention never gets
    cheaper with more context: a falling fit is noise, so the mean, flat)."""
    a, b = _fit(depths, ms)
    return (a, b) if b >= 0 else (sum(ms) / len(ms), 0.0)


@dataclass(frozen=True)
class Pick:
    """The setting `Rates.pick` chose for a run's shape: ``label`` (None:
    the default kept, a tie or a red flag), the predicted seconds of every
    setting it weighed, and why."""

    label: str | None
    default: str
    seconds: Mapping[str, float]
    why: str

    def compared(self) -> str:
        """The predictions, fastest first: "f16/f16 fa off 10.6 s, f16/f16 fa on 11.1 s"."""
        return ", ".join(f"{k} {v:.2f} s" for k, v in sorted(self.seconds.items(), key=lambda kv: kv[1]))


@dataclass(frozen=True)
class Rates:
    """For each KV-types and flash-attention setting measured (`setting_label`):
    prompt tokens evaluated a second at ``fill_depths`` (the middle of each
    filled stretch, in batches of ``chunk`` tokens) and decode milliseconds a
    token at ``decode_depths``. ``noise``: the decode samples' typical
    spread, as a share. Each becomes a line over depth, so that a run's time
    is predicted for its own prompt and answer (`seconds`)."""

    fill_depths: tuple[int, ...]
    fill_tps: Mapping[str, tuple[float, ...]]
    decode_depths: tuple[int, ...]
    decode_ms: Mapping[str, tuple[float, ...]]
    chunk: int = 0
    noise: float = 0.0

    @property
    def settings(self) -> tuple[str, ...]:
        return tuple(k for k in self.decode_ms if k in self.fill_tps)

    def decode_line(self, label: str) -> tuple[float, float] | None:
        """A decode step's milliseconds with ``label`` as a line over the
        context's depth, (at depth 0, per token of depth), never falling;
        None where ``label`` was not measured."""
        ms = self.decode_ms.get(label)
        return _rising(self.decode_depths, ms) if ms else None

    def seconds(self, label: str, run: RunShape) -> float:
        """The predicted seconds of ``run`` with ``label``: each prompt token at
        the fill line's cost at its depth, each answer token at the decode
        line's (a line's sum over a stretch is its count times the cost at
        the stretch's middle)."""
        fa, fb = _rising(self.fill_depths, [1e3 / max(t, 1e-9) for t in self.fill_tps[label]])
        line = self.decode_line(label)
        assert line is not None  # every setting of `settings` has its decode rates
        da, db = line
        fill = run.prompt * (fa + fb * (run.start + run.prompt / 2))
        decode = run.answer * (da + db * (run.start + run.prompt + run.answer / 2))
        return (fill + decode) / 1e3

    def pick(self, run: RunShape, default: str, allowed: Sequence[str] | None = None) -> Pick:
        """The setting of ``allowed`` (None: every one measured) predicted
        fastest for ``run``. ``default`` (llama.cpp's: f16 with flash
        attention on, as its auto settles on a CPU) is kept when it is within
        the tie margin or the noise of the fastest, or when the fastest is
        predicted more than `MAX_GAIN` times as fast (a machine that was busy,
        not a result); among settings tied with the fastest, the default's KV
        types (no quantization) come first."""
        names = [k for k in (allowed if allowed is not None else self.settings) if k in self.settings]
        seconds = {k: self.seconds(k, run) for k in names}
        if not seconds:
            return Pick(None, default, seconds, "none of the settings measured applies")
        fastest = min(seconds.values())
        margin = max(TIE_MARGIN, self.noise)
        tied = [k for k in seconds if seconds[k] - fastest <= margin * fastest]
        if default in tied:
            alike = "fastest" if tied == [default] else "alike"
            return Pick(None, default, seconds, f"predicted {alike} for a {run.describe()}")
        kv = default.partition(" fa ")[0]
        best = min([k for k in tied if k.partition(" fa ")[0] == kv] or tied, key=lambda k: seconds[k])
        if default not in seconds:  # nothing to weigh the others against: the default stands
            return Pick(None, default, seconds, f"{default} was not measured")
        base = seconds[default]
        if base > MAX_GAIN * seconds[best]:
            gain = base / seconds[best]
            return Pick(None, default, seconds, f"{best} predicted {gain:.1f}x as fast: more than a setting gives")
        gain = base / seconds[best]
        return Pick(best, default, seconds, f"predicted {gain:.2f}x as fast as {default} for a {run.describe()}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "fill_depths": list(self.fill_depths),
            "fill_tps": {k: [round(x, 2) for x in v] for k, v in self.fill_tps.items()},
            "decode_depths": list(self.decode_depths),
            "decode_ms": {k: [round(x, 3) for x in v] for k, v in self.decode_ms.items()},
            "chunk": self.chunk,
            "noise": self.noise,
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Rates:
        if not isinstance(raw, dict):
            raise ValueError("the rates are not an object")
        fill_depths = tuple(int(d) for d in raw["fill_depths"])
        decode_depths = tuple(int(d) for d in raw["decode_depths"])
        fill = {str(k): tuple(float(x) for x in v) for k, v in raw["fill_tps"].items()}
        decode = {str(k): tuple(float(x) for x in v) for k, v in raw["decode_ms"].items()}
        if not fill_depths or not decode_depths:
            raise ValueError("the rates lack their depths")
        for label, figures in fill.items():
            parse_setting(label)
            if len(figures) != len(fill_depths) or min(figures) <= 0:
                raise ValueError(f"the prompt rates of {label} do not match their depths")
        for label, figures in decode.items():
            parse_setting(label)
            if len(figures) != len(decode_depths):
                raise ValueError(f"the decode rates of {label} do not match their depths")
        return cls(fill_depths, fill, decode_depths, decode, int(raw.get("chunk", 0)), float(raw.get("noise", 0.0)))


@dataclass(frozen=True)
class Wisdom:
    """What `localrun tune` (and `localrun bench`) measured for one key."""

    machine: Machine
    model: ModelKey
    kv: str  # the KV types measured with, "f16/f16"
    measured_at: str  # ISO time
    seconds: float = 0.0  # how long the tuning took
    threads: Decision | None = None  # value: a thread count
    n_ubatch: Decision | None = None  # value: the prompt-evaluation batch size
    flash_attn: Attention | None = None
    verify_ms: tuple[float, ...] = ()  # a batch of r rows (r = 1..), one sequence, ms
    parallel: Decision | None = None  # value: sequences decoded together
    kv_cost: Decision | None = None  # decode ms per token at depth per KV types; value: the fastest or None
    kv_depth: int = 0  # the depth kv_cost was measured at
    rates: Rates | None = None  # prompt and decode speed per KV types and flash attention (None: an older tune)
    bench: Mapping[str, Any] = field(default_factory=dict)  # `localrun bench`'s advice
    busy: float = 0.0  # the share of the CPUs other processes took while it measured
    unmeasured: Mapping[str, str] = field(default_factory=dict)  # phase: why it decides nothing (machine busy)

    @property
    def verify_curve(self) -> tuple[float, ...] | None:
        """The cost of a verify batch of r rows in plain steps (r = 1..)."""
        if not self.verify_ms or self.verify_ms[0] <= 0:
            return None
        return tuple(ms / self.verify_ms[0] for ms in self.verify_ms)

    def keeping(self, previous: Wisdom) -> Wisdom:
        """This entry, with what ``previous`` measured for the phases this one
        could not measure (a run on a busy machine changes no default)."""
        kept = {name: getattr(previous, name) for phase in self.unmeasured for name in PHASE_FIELDS[phase]}
        still = {phase: why for phase, why in self.unmeasured.items() if phase in previous.unmeasured}
        return replace(self, **kept, unmeasured=still)

    def matches(self, machine: Machine, model: ModelKey, kv: str | None = None) -> bool:
        return self.machine == machine and self.model == model and (kv is None or self.kv == kv)

    def as_dict(self) -> dict[str, Any]:
        def opt(d: Decision | Attention | Rates | None) -> Any:
            return d.as_dict() if d is not None else None

        return {
            "machine": self.machine.as_dict(),
            "model": {"file": self.model.file, "size": self.model.size},
            "kv": self.kv,
            "measured_at": self.measured_at,
            "seconds": round(self.seconds, 1),
            "threads": opt(self.threads),
            "n_ubatch": opt(self.n_ubatch),
            "flash_attn": opt(self.flash_attn),
            "verify_ms": [round(x, 3) for x in self.verify_ms],
            "parallel": opt(self.parallel),
            "kv_cost": opt(self.kv_cost),
            "kv_depth": self.kv_depth,
            "rates": opt(self.rates),
            "bench": dict(self.bench),
            "busy": self.busy,
            "unmeasured": dict(self.unmeasured),
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Wisdom:
        if not isinstance(raw, dict):
            raise ValueError("an entry is not an object")
        model = raw.get("model")
        if (
            not isinstance(model, dict)
            or not isinstance(model.get("file"), str)
            or not isinstance(model.get("size"), int)
        ):
            raise ValueError("an entry lacks its model")

        def dec(name: str) -> Decision | None:
            return Decision.from_dict(raw[name]) if raw.get(name) is not None else None

        bench = raw.get("bench") or {}
        return cls(
            machine=Machine.from_dict(raw.get("machine")),
            model=ModelKey(model["file"], model["size"]),
            kv=str(raw["kv"]),
            measured_at=str(raw.get("measured_at", "")),
            seconds=float(raw.get("seconds", 0.0)),
            threads=dec("threads"),
            n_ubatch=dec("n_ubatch"),
            flash_attn=Attention.from_dict(raw["flash_attn"]) if raw.get("flash_attn") else None,
            verify_ms=tuple(float(x) for x in raw.get("verify_ms") or ()),
            parallel=dec("parallel"),
            kv_cost=dec("kv_cost"),
            kv_depth=int(raw.get("kv_depth", 0)),
            rates=Rates.from_dict(raw["rates"]) if raw.get("rates") else None,
            bench=bench if isinstance(bench, dict) else {},
            busy=float(raw.get("busy", 0.0)),
            unmeasured={str(k): str(v) for k, v in (raw.get("unmeasured") or {}).items()},
        )


@dataclass
class WisdomFile:
    """Every entry in the file (any machine's), and what was wrong with it."""

    path: Path
    entries: list[Wisdom] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    hinted: set[str] = field(default_factory=set)  # models already told how to tune
    damaged: bool = False  # the file holds something unreadable: `save` moves it aside, never overwrites it
    moved_to: Path | None = None  # where `save` moved the damaged file
    unreadable: bool = False  # the file is there but could not be read: `save` refuses to overwrite it

    @classmethod
    def load(cls, path: Path | None = None) -> WisdomFile:
        """The file's entries; a missing file is empty, an unreadable or
        corrupt one is empty with a problem to warn about (never raised).
        A damaged file is kept as it is until `save` moves it aside."""
        path = path or wisdom_file()
        found = cls(path)
        later = "; the next `localrun tune` keeps it aside and writes a new one"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return found
        except (OSError, UnicodeDecodeError) as exc:
            found.damaged = not isinstance(exc, IsADirectoryError | NotADirectoryError | PermissionError)
            found.unreadable = not found.damaged
            found.problems.append(f"{path} cannot be read and is ignored ({paths.why_failed(exc)})")
            return found
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            found.damaged = True
            found.problems.append(f"{path} is not valid JSON and is ignored ({exc}){later}")
            return found
        if not isinstance(raw, dict) or raw.get("version") not in READABLE or not isinstance(raw.get("entries"), list):
            found.damaged = True
            found.problems.append(f"{path} is not a wisdom file of version {VERSION} and is ignored{later}")
            return found
        for i, item in enumerate(raw["entries"]):
            try:
                found.entries.append(Wisdom.from_dict(item))
            except (KeyError, TypeError, ValueError) as exc:
                found.damaged = True
                found.problems.append(f"{path}: entry {i + 1} is ignored ({exc}){later}")
        hinted = raw.get("hinted", [])
        found.hinted = {h for h in hinted if isinstance(h, str)} if isinstance(hinted, list) else set()
        return found

    def find(self, model: ModelKey, kv: str | None = None, machine: Machine | None = None) -> Wisdom | None:
        """This machine's entry for ``model`` measured with ``kv`` (None: any KV types, f16 first)."""
        machine = machine or this_machine()
        mine = [w for w in self.entries if w.matches(machine, model, kv)]
        mine.sort(key=lambda w: (w.kv != "f16/f16", w.measured_at), reverse=False)
        return mine[0] if mine else None

    def foreign(self, model: ModelKey, machine: Machine | None = None) -> Wisdom | None:
        """An entry for ``model`` measured on another machine (to say why it is not used)."""
        machine = machine or this_machine()
        return next((w for w in self.entries if w.model == model and w.machine != machine), None)

    def put(self, wisdom: Wisdom) -> Wisdom:
        """Keep ``wisdom``, replacing the entry of its key; a phase it could not
        measure keeps the replaced entry's figures. Returns the entry kept."""
        previous = self.find(wisdom.model, wisdom.kv, wisdom.machine)
        if previous is not None and wisdom.unmeasured:
            wisdom = wisdom.keeping(previous)
        self.entries = [w for w in self.entries if not w.matches(wisdom.machine, wisdom.model, wisdom.kv)]
        self.entries.append(wisdom)
        return wisdom

    def merge_bench(self, model: ModelKey, kv: str, advice: Mapping[str, Any], measured_at: str) -> Wisdom:
        """Keep `localrun bench`'s advice in this machine's entry for ``model``."""
        current = self.find(model, kv) or Wisdom(this_machine(), model, kv, measured_at)
        updated = replace(current, bench=dict(advice))
        self.put(updated)
        return updated

    def save(self) -> Path:
        """Write the entries atomically; a damaged file found by `load` is moved
        aside first (``moved_to``), so what could not be read is never lost;
        one that could not be read at all (its permissions) is not
        overwritten: an OSError says so."""
        if self.unreadable:
            raise OSError(errno.EACCES, "it could not be read, so it is not overwritten", str(self.path))
        body = {
            "version": VERSION,
            "entries": [w.as_dict() for w in self.entries],
            "hinted": sorted(self.hinted),
        }
        paths.ensure_dir(self.path.parent)
        if self.damaged and self.path.is_file():
            self.moved_to = paths.move_aside(self.path)
            self.damaged = False
        paths.atomic_write(self.path, json.dumps(body, indent=1) + "\n")
        return self.path
