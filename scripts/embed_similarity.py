"""Check that real models put similar sentences closer than unrelated ones.

    .venv/bin/python scripts/embed_similarity.py MODEL [MODEL ...] [--pooling auto|mean|cls|last] [--serve]

Embeds a few pairs of paraphrases and prints, for each model and pair, the
cosine of the pair and the best cosine of its first sentence with any
sentence of the other pairs; exits 1 when a paraphrase is not the nearer.
By default each model goes through `localrun embed`; with --serve, all of
them through one `localrun serve -m A -m B ... --pooling P`, with the
official `openai` client's `embeddings.create` (each vector also checked for
the model's width and unit length). A tiny random-weight model cannot show
this, so it is a script run by hand, not a test.
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
from scripts.bench_serve import serve_process

HERE = Path(__file__).resolve().parent.parent
PAIRS = [
    ("The cat is sleeping on the sofa.", "A cat naps on the couch."),
    ("How do I reset my password?", "I forgot my password and need to change it."),
    ("The stock market fell sharply today.", "Share prices dropped a lot this afternoon."),
    ("Preheat the oven to 200 degrees.", "Heat the oven up to 200 degrees before baking."),
]


def by_cli(model: Path, texts: list[str], pooling: str) -> np.ndarray:
    cmd = [str(HERE / ".venv" / "bin" / "localrun"), "embed", "-m", str(model), "--pooling", pooling]
    done = subprocess.run(cmd, input="\n".join(texts) + "\n", capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(done.stderr.strip())
    return np.array([json.loads(line) for line in done.stdout.splitlines()])


def by_server(models: list[Path], texts: list[str], pooling: str) -> dict[str, np.ndarray]:
    """Each model's vectors from one server serving them all, through the official client."""
    vectors: dict[str, np.ndarray] = {}
    each = [arg for model in models for arg in ("-m", str(model))]
    with serve_process(["--parallel", "1", "--pooling", pooling, *each]) as server:
        client = server.client()
        for entry in client.models.list().data:
            result = client.embeddings.create(model=entry.id, input=texts)
            got = np.array([d.embedding for d in result.data])
            norms = np.linalg.norm(got, axis=1)
            print(f"{entry.id}: {len(texts)} vectors of width {got.shape[1]}, "
                  f"lengths {norms.min():.6f}-{norms.max():.6f}")  # fmt: skip
            if not np.allclose(norms, 1.0, atol=1e-4):
                raise SystemExit(f"{entry.id}: vectors are not of unit length")
            vectors[entry.id] = got
        client.close()
    return vectors


def nearer(name: str, vectors: np.ndarray, texts: list[str]) -> int:
    """Prints each pair's verdict; the pairs whose paraphrase is not the nearer."""
    similarity = vectors @ vectors.T
    failed = 0
    for k, (first, _) in enumerate(PAIRS):
        i, j = 2 * k, 2 * k + 1
        others = [similarity[i, m] for m in range(len(texts)) if m // 2 != k]
        ok = similarity[i, j] > max(others)
        failed += not ok
        verdict = "ok" if ok else "NO"
        print(
            f"{name[:24]:24}  {first[:40]:40}  pair {similarity[i, j]:.3f}  best unrelated {max(others):.3f}  {verdict}"
        )
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--pooling", default="auto")
    parser.add_argument("--serve", action="store_true", help="through one localrun serve and the openai client")
    args = parser.parse_args()
    texts = [t for pair in PAIRS for t in pair]
    paths = [model_path(m) for m in args.models]
    if args.serve:
        runs = by_server(paths, texts, args.pooling)
    else:
        runs = {path.stem: by_cli(path, texts, args.pooling) for path in paths}
    failed = sum(nearer(name, vectors, texts) for name, vectors in runs.items())
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
