from __future__ import annotations

import json
import random
import re
import xml.dom.minidom
from pathlib import Path

import numpy as np
import pytest

from localrun import bench, config
from localrun.bench.stats import QUALITY_LIMIT, Row, advise, relate_to_baseline, relative_range
from localrun.events import DoneEvent, Event, Stats, TokenEvent
from localrun.gguf.reader import GGUFInfo
from localrun.quantiles import median, percentile
from localrun.runtime import engine
from localrun.runtime.generate import generate
from localrun.runtime.placement import ModelPlacement, Placement
from localrun.runtime.quantize import quantize
from localrun.runtime.sampling import SamplingParams
from localrun.tune.wisdom import wisdom_file
from tests.helpers import cli, engine_config
from tests.tinymodel import write_tiny_model

# ------------------------------------------------------------- arithmetic --

pytestmark = pytest.mark.usefixtures("quiet")  # the machine reads idle: other tests' processes do not count


def test_percentiles_of_known_samples() -> None:
    samples = [float(x) for x in range(100, 0, -1)]  # 100..1, unsorted on purpose
    assert percentile(samples, 50) == pytest.approx(50.5)
    assert percentile(samples, 95) == pytest.approx(95.05)
    assert percentile(samples, 0) == 1.0 and percentile(samples, 100) == 100.0
    assert percentile([7.0], 95) == 7.0
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 3.0, 2.0]) == 2.5
    rng = random.Random(1)
    noisy = [rng.expovariate(0.1) for _ in range(257)]
    for q in (5, 50, 90, 95, 99):
        assert percentile(noisy, q) == pytest.approx(float(np.percentile(noisy, q)))
    with pytest.raises(ValueError):
        percentile([], 50)


def test_spread_is_range_over_median() -> None:
    assert relative_range([9.0, 10.0, 12.0]) == pytest.approx(0.3)
    assert relative_range([5.0]) == 0.0


def _events(ttft: float, marks: list[tuple[int, float]], total: int) -> list[Event]:
    out: list[Event] = [TokenEvent("x", n, ttft, t, 0.0) for n, t in marks]
    stats = Stats(
        prompt_tokens=3,
        generated_tokens=total,
        ttft_s=ttft,
        decode_tokens_per_s=0.0,
        elapsed_s=marks[-1][1],
        stop_reason="length",
    )
    return [*out, DoneEvent(stats)]


def test_token_times_from_event_timestamps() -> None:
    # token 1 at 1.0 s; token 3 produced no text of its own (its event comes with token 4)
    stats, times = bench.token_times(_events(1.0, [(1, 1.0), (2, 1.1), (4, 1.35), (5, 1.4)], 5))
    assert stats.generated_tokens == 5
    assert times == pytest.approx([100.0, 125.0, 125.0, 50.0])


# ----------------------------------------------------------------- advice --


def _row(name: str, rate: float, *, spread: float = 0.02, ppl: float = 10.0, **kw: object) -> Row:
    settings = kw.pop("settings", {"kv_k": name, "kv_v": name})
    return Row(
        name,
        decode_tokens_per_s=rate,
        repeats_tokens_per_s=[rate],
        spread=spread,
        perplexity=ppl,
        settings=settings,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def test_advice_follows_the_measurements() -> None:
    base = _row("baseline", 10.0, settings={"kv_k": "f16", "kv_v": "f16"})
    faster = _row("q8_0", 12.0)
    rows = [base, faster]
    relate_to_baseline(rows, base)
    advice = advise(rows, base)
    assert advice.interactive == "q8_0" and advice.defaults == {"kv_k": "q8_0", "kv_v": "q8_0"}
    assert "interactive: q8_0 (12.0 tok/s, 1.20x)" in advice.text


def test_advice_keeps_the_baseline_within_noise() -> None:
    base = _row("baseline", 10.0, spread=0.15, settings={"kv_k": "f16", "kv_v": "f16"})
    rows = [base, _row("q8_0", 11.0)]  # +10%, but the baseline's rounds spread 15%
    relate_to_baseline(rows, base)
    advice = advise(rows, base)
    assert advice.interactive == "baseline" and advice.batch == "baseline"
    assert advice.defaults == {"kv_k": "f16", "kv_v": "f16"}
    assert "no technique beat the baseline" in advice.text


def test_advice_rejects_a_fast_setting_that_ruins_quality() -> None:
    base = _row("baseline", 10.0, settings={"kv_k": "f16", "kv_v": "f16"})
    broken = _row("q4_0", 20.0, ppl=10.0 * (1 + QUALITY_LIMIT * 3))
    good = _row("q8_0", 13.0, ppl=10.05)
    rows = [base, broken, good]
    relate_to_baseline(rows, base)
    advice = advise(rows, base)
    assert advice.interactive == "q8_0"
    assert "not advised for quality" in advice.text and "q4_0" in advice.text


def test_advice_for_batch_work_takes_aggregate_throughput() -> None:
    base = _row("baseline", 10.0, settings={"kv_k": "f16", "kv_v": "f16"})
    batch4 = _row("batching n=4", 21.0, sequences=4, settings={"parallel": 4})
    weights = _row("weights q8_0", 30.0, settings=None)  # a file, not a setting: never advised
    rows = [base, batch4, weights]
    relate_to_baseline(rows, base)
    advice = advise(rows, base)
    assert advice.interactive == "baseline"
    assert advice.batch == "batching n=4"
    assert advice.defaults == {"kv_k": "f16", "kv_v": "f16", "parallel": 4}


def test_relate_to_baseline() -> None:
    base = _row("baseline", 10.0, ppl=20.0)
    other = _row("x", 5.0, ppl=21.0)
    relate_to_baseline([base, other], base)
    assert base.speedup == 1.0 and other.speedup == pytest.approx(0.5)
    assert other.perplexity_change == pytest.approx(0.05) and base.perplexity_change == 0.0


# ----------------------------------------------------------- measurement --


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny model with head size 32 (quantized KV caches need it), as f32,
    and quantized to q4_0 and q8_0 side by side."""
    folder = tmp_path_factory.mktemp("bench")
    f32 = write_tiny_model(folder / "wide-f32.gguf", n_embd=128, n_head=4, n_head_kv=2)
    out = {"f32": f32}
    for q in ("q4_0", "q8_0"):
        out[q] = quantize(f32, folder / f"wide-{q}.gguf", q).path
    return out


def _quick(**kw: object) -> bench.Plan:
    settings: dict[str, object] = {"rounds": 2, "max_tokens": 6, "ppl_tokens": 64, "ppl_window": 32, **kw}
    return bench.Plan.make(True, **settings)


def test_every_available_row_is_produced(weights: dict[str, Path]) -> None:
    steps: list[bench.Progress] = []
    full = bench.Plan.make(False, rounds=2, max_tokens=6, prompts=bench.PROMPTS[:1], ppl_tokens=64, ppl_window=32)
    result = bench.run(bench.Bench(weights["q4_0"], full), progress=steps.append)
    rows = {r.technique: r for r in result.rows}
    measured = ["baseline", "kv-cache q8_0", "kv-cache q4_0", "kv-cache q8_0/q4_0", "weights q8_0"]
    for name in measured:
        row = rows[name]
        assert row.measured, (name, row.note)
        assert row.decode_tokens_per_s and row.decode_tokens_per_s > 0
        assert len(row.repeats_tokens_per_s) == 2
        assert row.p50_token_ms is not None and row.p95_token_ms is not None
        assert 0 < row.p50_token_ms <= row.p95_token_ms
        assert row.ttft_s and row.ttft_s > 0
        assert row.peak_rss_bytes and row.peak_rss_bytes > 10**6
        assert row.perplexity and row.perplexity > 1
        assert row.speedup is not None
    assert rows["weights q8_0"].note == "wide-q8_0.gguf"
    assert rows["baseline"].speedup == 1.0 and rows["baseline"].perplexity_change == 0.0
    # measured KV bytes per token: q8_0 stores 34 bytes and q4_0 18 bytes per 32 values, f16 64
    f16, q8, q4 = (rows[n].kv_bytes_per_token or 0 for n in ("baseline", "kv-cache q8_0", "kv-cache q4_0"))
    assert q8 / f16 == pytest.approx(34 / 64, rel=0.02) and q4 / f16 == pytest.approx(18 / 64, rel=0.02)
    fits = [rows[n].context_fits or 0 for n in ("baseline", "kv-cache q8_0", "kv-cache q4_0")]
    assert fits[0] < fits[1] < fits[2]
    assert not rows["speculative draft"].available and "no draft model" in rows["speculative draft"].note
    for name in ("speculative lookup", "speculative auto"):
        assert rows[name].measured and rows[name].decode_tokens_per_s, rows[name].note
        assert 0.0 <= rows[name].extra["acceptance"] <= 1.0
    batching = [rows[f"batching n={n}"] for n in (1, 2, 4, 8)]
    for row in batching:
        assert row.measured and row.decode_tokens_per_s and row.decode_tokens_per_s > 0, row.note
        assert row.p50_token_ms is not None and row.ttft_s and row.ttft_s > 0
        assert row.extra["total_tokens_per_s"] > 0  # the whole run's aggregate, prompts included
        assert row.kv_bytes_per_token == pytest.approx(
            f16, rel=0.05
        )  # per token, whatever the sequences (llama.cpp logs MiB to 2 places)
    assert [s.done for s in steps] == list(range(len(steps)))
    runs = [
        r for r in result.rows if r.measured
    ]  # each measured row once per round, one perplexity per row that has one
    assert steps[-1].done == steps[-1].total == full.rounds * len(runs) + sum(r.perplexity is not None for r in runs)
    fa = rows["flash attention off"]  # the other mode than auto's (llama.cpp's: on, for the CPU)
    assert fa.measured and fa.settings == {"flash_attn": "off"} and fa.perplexity is None
    assert result.advice.interactive in rows
    assert rows["speculative auto"].note in {"lookup", "plain"}  # what auto used (no draft model here)


def test_rows_on_one_file_load_it_once(weights: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[str] = []
    load = engine._load_model

    def counting(info: GGUFInfo, placed: ModelPlacement, *, mtp: bool = False) -> object:
        loads.append(info.path.name)
        return load(info, placed, mtp=mtp)

    monkeypatch.setattr(engine, "_load_model", counting)
    result = bench.run(bench.Bench(weights["q4_0"], _quick(rounds=2)))
    assert all(r.measured for r in result.rows)
    q4, q8 = weights["q4_0"].name, weights["q8_0"].name
    # per round: five rows on the 4-bit file, then the 8-bit row; perplexity: three 4-bit rows, then the 8-bit one
    assert loads == [q4, q8, q4, q8, q4, q8]


def test_engines_share_loaded_weights(weights: dict[str, Path]) -> None:
    path = weights["q8_0"]
    greedy = SamplingParams(temperature=0.0)

    def text(e: engine.Engine) -> str:
        tokens = e.tokenize("Once upon a time")
        return "".join(ev.text for ev in generate(e, tokens, greedy, max_tokens=12) if isinstance(ev, TokenEvent))

    with engine.Engine(engine_config(path, n_ctx=256)) as own:
        expected = text(own)
    with engine.Weights(path, Placement()) as shared:
        for kv in ("f16", "q8_0"):  # one engine after another on the same load
            with engine.Engine(engine_config(path, n_ctx=256, type_k=kv), weights=shared) as e:
                assert e.info.path == path
                if kv == "f16":
                    assert text(e) == expected
                else:
                    assert text(e)
        assert shared.handle  # closing the engines left the model loaded
        with pytest.raises(ValueError):
            engine.Engine(engine_config(weights["q4_0"]), weights=shared)


def test_quick_keeps_one_row_per_technique(weights: dict[str, Path]) -> None:
    result = bench.run(bench.Bench(weights["q4_0"], _quick(rounds=1)))
    assert [r.technique for r in result.rows] == [
        "baseline",
        "kv-cache q8_0",
        "kv-cache q4_0",
        "speculative auto",
        "batching n=4",
        "weights q8_0",
    ]
    assert all(r.measured for r in result.rows), [(r.technique, r.note) for r in result.rows]


def test_a_row_the_model_cannot_take_is_marked_unavailable(tiny_model: Path) -> None:
    """The tiny model's head size (16) is too small for a quantized KV cache."""
    result = bench.run(bench.Bench(tiny_model, _quick()), techniques=[bench.baseline_rows, bench.kv_cache_rows])
    rows = {r.technique: r for r in result.rows}
    assert rows["baseline"].measured
    assert not rows["kv-cache q8_0"].available and "multiple of 32" in rows["kv-cache q8_0"].note


def test_a_technique_of_its_own_gets_its_row(tiny_model: Path) -> None:
    def fake_measure(b: bench.Bench) -> bench.Round:
        plain = b.single(b.engine_config(n_threads=1))
        return bench.Round(
            plain.decode_tokens_per_s, plain.token_ms, plain.ttft_s, plain.peak_rss_bytes, extra={"acceptance": 0.75}
        )

    def one_thread(b: bench.Bench) -> list[bench.RowSpec]:
        return [bench.RowSpec("one thread", fake_measure, settings={"threads": 1})]

    result = bench.run(bench.Bench(tiny_model, _quick()), techniques=[bench.baseline_rows, one_thread])
    row = result.rows[1]
    assert row.technique == "one thread" and row.measured and row.extra == {"acceptance": 0.75}
    assert row.as_dict()["acceptance"] == 0.75


def test_other_weights_are_found_beside_the_model(tmp_path: Path) -> None:
    q4 = tmp_path / "Model-7B-Q4_K_M.gguf"
    q4.write_bytes(b"")
    assert bench.other_weights(q4) is None
    q8 = tmp_path / "Model-7B-Q8_0.gguf"
    q8.write_bytes(b"")
    assert bench.other_weights(q4) == q8
    assert bench.other_weights(q8) == q4
    assert bench.other_weights(tmp_path / "plain.gguf") is None


# -------------------------------------------------------------------- CLI --

ROW_FIELDS = {
    "technique": str,
    "decode_tokens_per_s": float,
    "speedup": float,
    "p50_token_ms": float,
    "p95_token_ms": float,
    "ttft_s": float,
    "peak_rss_bytes": int,
    "spread": float,
    "repeats_tokens_per_s": list,
    "kv_bytes_per_token": float,
    "context_fits": int,
    "perplexity": float,
    "perplexity_change": float,
    "available": bool,
    "note": str,
    "sequences": int,
}


def test_json_schema_chart_and_saved_defaults(weights: dict[str, Path], tmp_path: Path) -> None:
    chart = tmp_path / "bench.svg"
    args = ["bench", "--quick", "--rounds", "1", "-n", "4", "-m", str(weights["q4_0"]), "--json"]
    res = cli(*args, "--chart", str(chart), "--save-defaults")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)  # stdout is the JSON object alone
    assert data["mode"] == "quick" and data["rounds"] == 1 and data["max_tokens"] == 4
    assert {r["technique"] for r in data["rows"]} >= {"baseline", "kv-cache q8_0", "kv-cache q4_0", "weights q8_0"}
    for row in data["rows"]:
        if not row["available"]:
            assert row["decode_tokens_per_s"] is None and row["note"]
            continue
        for key, kind in ROW_FIELDS.items():
            if key.startswith("perplexity") and row["technique"].startswith(("batching", "speculative")):
                assert row[key] is None  # lossless: they do not change what the model computes
                continue
            assert isinstance(row[key], kind), (row["technique"], key, row[key])
    advice = data["advice"]
    assert set(advice) == {"interactive", "batch", "defaults", "text"}
    assert advice["interactive"] in {r["technique"] for r in data["rows"]}
    saved = config.load()
    assert advice["defaults"]  # the advised rows' settings (KV types, draft, parallel: whichever were fastest)
    for key, value in advice["defaults"].items():
        assert getattr(saved, key) == value, key
    assert "saved defaults to" in res.stderr
    doc = xml.dom.minidom.parse(str(chart))
    labels = [t.firstChild.data for t in doc.getElementsByTagName("text") if t.firstChild]  # type: ignore[union-attr]
    for row in data["rows"]:
        assert row["technique"] in labels
    measured = sum(1 for r in data["rows"] if r["available"])
    assert len(doc.getElementsByTagName("rect")) == 1 + measured  # the background and one bar per measured row


def test_table_into_a_pipe(weights: dict[str, Path]) -> None:
    res = cli("bench", "--quick", "--rounds", "1", "-n", "3", "-m", str(weights["q8_0"]))
    assert res.returncode == 0, res.stderr
    assert "\x1b[" not in res.stdout
    for name in ("baseline", "kv-cache q8_0", "kv-cache q4_0", "speculative auto", "batching n=4", "weights q4_0"):
        assert name in res.stdout
    assert re.search(r"^advice: interactive: ", res.stdout, re.M)
    assert "round 1/1" in res.stderr  # progress goes to stderr


def test_bench_usage_errors(tiny_model: Path) -> None:
    res = cli("bench", "-m", str(tiny_model), "--rounds", "0")
    assert res.returncode == 2 and "--rounds" in res.stderr
    res = cli("bench", "-m", str(tiny_model), "--budget", "lots")
    assert res.returncode == 2 and "not a size" in res.stderr


# --------------------------------------------------------------- quantize --


def test_quantize_writes_a_loadable_file_of_the_requested_type(weights: dict[str, Path], tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType, LlamaFileType

    from localrun.gguf.reader import read_gguf
    from localrun.runtime.engine import Engine
    from localrun.runtime.generate import generate
    from localrun.runtime.sampling import SamplingParams

    out = tmp_path / "out-q8_0.gguf"
    res = cli("quantize", str(weights["f32"]), str(out), "--type", "q8_0")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(out)
    info = read_gguf(out)
    assert info.metadata["general.file_type"] == LlamaFileType.MOSTLY_Q8_0
    matrices = [t for t in info.tensors if len(t.shape) == 2]
    assert matrices and all(t.type == GGMLQuantizationType.Q8_0 for t in matrices)
    assert out.stat().st_size < weights["f32"].stat().st_size / 3
    with Engine(engine_config(out, n_ctx=256)) as engine:
        events = list(generate(engine, engine.tokenize("hello"), SamplingParams(temperature=0), max_tokens=4))
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.stats.generated_tokens == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out-q8_0.gguf"]  # no temporary file left


def test_quantize_refuses_to_overwrite_without_force(weights: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "exists.gguf"
    out.write_bytes(b"keep me")
    res = cli("quantize", str(weights["f32"]), str(out), "--type", "q4_0")
    assert res.returncode == 2 and "already exists" in res.stderr and "--force" in res.stderr
    assert out.read_bytes() == b"keep me"
    res = cli("quantize", str(weights["f32"]), str(out), "--type", "q4_0", "--force")
    assert res.returncode == 0, res.stderr
    assert out.read_bytes()[:4] == b"GGUF"


def test_quantize_errors(weights: dict[str, Path], tmp_path: Path) -> None:
    res = cli("quantize", str(weights["f32"]), str(tmp_path / "x.gguf"), "--type", "q9_9")
    assert res.returncode == 2 and "unknown quantization type" in res.stderr and "q4_k_m" in res.stderr
    res = cli("quantize", str(weights["q4_0"]), str(tmp_path / "y.gguf"), "--type", "q8_0")
    assert res.returncode == 2 and "already quantized" in res.stderr and "--allow-requantize" in res.stderr
    res = cli("quantize", str(tmp_path / "missing.gguf"), str(tmp_path / "z.gguf"), "--type", "q8_0")
    assert res.returncode == 3
    assert list(tmp_path.iterdir()) == []
    res = cli("quantize", str(weights["q4_0"]), str(tmp_path / "y.gguf"), "--type", "q8_0", "--allow-requantize")
    assert res.returncode == 0, res.stderr


def test_a_bench_on_a_busy_machine_advises_nothing_and_keeps_nothing(
    weights: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from localrun.runtime import load

    monkeypatch.setattr(load, "runnable_others", lambda: 1)  # another process runnable at every reading
    args = ["bench", "--quick", "--rounds", "1", "-n", "3", "-m", str(weights["q4_0"]), "--json", "--save-defaults"]
    res = cli(*args)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert "machine busy" in data["busy"] and data["advice"]["defaults"] == {}
    assert data["advice"]["interactive"] is None and "machine busy" in data["advice"]["text"]
    assert "the advice is not kept" in res.stderr and "saved defaults" not in res.stderr
    assert not config.config_file().exists()  # no defaults saved
    assert not wisdom_file().exists()


def test_the_ladder_batches_a_gpu_further_than_a_cpu() -> None:
    """The batching rows follow the placement: a CPU's few sequences, a GPU's many."""
    from types import SimpleNamespace

    from localrun.bench.techniques import CPU_BATCHES, GPU_BATCHES, batching_rows
    from localrun.runtime.placement import Placement

    def names(model: ModelPlacement, quick: bool = False) -> list[str]:
        base = SimpleNamespace(placement=Placement(model=model))
        fake = SimpleNamespace(base=base, plan=SimpleNamespace(quick=quick))
        return [row.technique for row in batching_rows(fake)]  # type: ignore[arg-type]

    gpu = ModelPlacement(n_gpu_layers=99, devices=("CUDA0",), layers=24)
    assert names(ModelPlacement()) == [f"batching n={n}" for n in CPU_BATCHES]
    assert names(gpu) == [f"batching n={n}" for n in GPU_BATCHES] and max(GPU_BATCHES) > max(CPU_BATCHES)
    assert names(ModelPlacement(), quick=True) == ["batching n=4"] and names(gpu, quick=True) == ["batching n=16"]
