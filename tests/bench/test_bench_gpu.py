"""The device check's own logic, on the CPU: its rows and its reading of llama-bench."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from scripts.bench_gpu import Row, Setup, llama_bench, table


def test_a_row_compares_within_rounds_and_says_whether_the_goal_is_met() -> None:
    row = Row("q7", "decode tg128", ours=[96.0, 100.0], theirs=[100.0, 100.0], goal=0.95)
    assert row.cells()[5:7] == ["0.980x", ">= 0.95x met"]
    slow = Row("q7", "serve", ours=[80.0], theirs=[100.0], goal=0.9)
    assert slow.cells()[5:7] == ["0.800x", ">= 0.9x NOT met"]
    alone = Row("q7", "prompt pp512", theirs=[5000.0], goal=0.95)
    alone.say("localrun has no --gpu-layers")
    alone.say("second note")
    assert alone.cells()[2] == "-" and alone.cells()[6] == ">= 0.95x not measured"
    assert alone.cells()[7] == "localrun has no --gpu-layers; second note"
    assert table([row, slow]).count("\n") == 3


def test_llama_bench_json_is_read_for_pp512_and_tg128(tmp_path: Path) -> None:
    tests = [
        {"n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ts": 10123.5, "flash_attn": 1},
        {"n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ts": 251.25, "flash_attn": 1},
    ]
    fake = tmp_path / "llama-bench"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'args'}\ncat <<'EOF'\n{json.dumps(tests)}\nEOF\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    setup = Setup(tmp_path, "all", "on", has_gpu_option=False)
    assert llama_bench(setup, tmp_path / "m.gguf", reps=1) == (10123.5, 251.25)
    args = (tmp_path / "args").read_text().split()
    assert args[args.index("-ngl") + 1] == "99" and args[args.index("-fa") + 1] == "on"
    assert not setup.ours_runs and setup.localrun_options() == []  # no --gpu-layers: localrun's rows wait
    assert Setup(tmp_path, "0", "on", has_gpu_option=False).ours_runs  # the CPU dry run needs no option
    assert Setup(tmp_path, "all", "on", has_gpu_option=True).localrun_options() == ["--gpu-layers", "all"]


def test_the_sampling_rows_are_both_sides_of_one_run_or_both_failed(tiny_model: Path, tmp_path: Path) -> None:
    """The sampling section runs scripts/bench_sampling.py on the CPU and
    fills a row per count of sequences, in-graph against host tokens/s of
    the same rounds; a run that fails marks every row, not only the first."""
    import argparse

    from scripts.bench_gpu import section_sampling

    setup = Setup(tmp_path, "0", "on", has_gpu_option=False)
    args = argparse.Namespace(clients=1, reps=1, tokens=12)
    rows: list[Row] = []
    section_sampling(setup, tiny_model, rows, args, 120)
    assert [r.what for r in rows] == ["in-graph sampling, 1 seq.", "in-graph sampling, 2 seq."]
    assert all(len(r.ours) == len(r.theirs) == 1 and r.ours[0] > 0 and r.theirs[0] > 0 for r in rows)
    assert not any(r.failed for r in rows)
    missing: list[Row] = []
    section_sampling(setup, tmp_path / "none.gguf", missing, args, 120)
    assert len(missing) == 2 and all(r.failed and "FAILED" in r.note and not r.ours for r in missing)
