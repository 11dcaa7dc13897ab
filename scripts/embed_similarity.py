#!/usr/bin/env python3
"""Check that a real embedding model puts similar sentences closer than unrelated ones.

    .venv/bin/python scripts/embed_similarity.py MODEL [--pooling auto|mean|cls|last]

Embeds a few pairs of paraphrases with `localrun embed` and prints, for
each, the cosine of the pair and the best cosine of its first sentence
with any sentence of the other pairs; exits 1 when a paraphrase is not the
nearer. A tiny random-weight model cannot show this, so it is a script run
by hand, not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from scripts._models import HelpFormatter, model_path

HERE = Path(__file__).resolve().parent.parent
PAIRS = [
    ("The cat is sleeping on the sofa.", "A cat naps on the couch."),
    ("How do I reset my password?", "I forgot my password and need to change it."),
    ("The stock market fell sharply today.", "Share prices dropped a lot this afternoon."),
    ("Preheat the oven to 200 degrees.", "Heat the oven up to 200 degrees before baking."),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--pooling", default="auto")
    args = parser.parse_args()
    texts = [t for pair in PAIRS for t in pair]
    cmd = [str(HERE / ".venv" / "bin" / "localrun"), "embed", "-m", str(model_path(args.model))]
    done = subprocess.run(
        [*cmd, "--pooling", args.pooling], input="\n".join(texts) + "\n", capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr.strip())
    vectors = np.array([json.loads(line) for line in done.stdout.splitlines()])
    similarity = vectors @ vectors.T
    failed = 0
    for k, (first, _) in enumerate(PAIRS):
        i, j = 2 * k, 2 * k + 1
        others = [similarity[i, m] for m in range(len(texts)) if m // 2 != k]
        nearer = similarity[i, j] > max(others)
        failed += not nearer
        verdict = "ok" if nearer else "NO"
        print(f"{first[:40]:40}  pair {similarity[i, j]:.3f}  best unrelated {max(others):.3f}  {verdict}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
