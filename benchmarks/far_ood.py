"""Far-OOD text against each committed text model's default version, scored exactly as served: the offline batch
scorer (``service.batch_scoring``: the server's own artifacts, batching and OOD rule) on in-distribution sentences and
on far-OOD kinds generated with seeds no export used (``training.data.far_ood_texts``; the OOD-validation families
draw from seeds near the config's), and the AUROC of the served ``ood_score`` for each pair, beside the served score's
name and the version's method. The in-distribution side is the model's own test sentences and, the hard case,
product-review sentences (Amazon, from the VADER corpus), which a movie-review model should call in-distribution
more readily than gibberish.

    .venv/bin/python -m benchmarks.far_ood --out docs/benchmarks-far-ood.json --markdown docs/benchmarks-far-ood.md
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

from sklearn.metrics import roc_auc_score

from artifact.contract import parse_manifest, read_document
from service.batch_scoring import main as score_file
from training.data.far_ood_texts import FAR_OOD_KINDS
from training.data.texts import load_movie_reviews, load_shift_sets

HELD_OUT_SEED = 90_210  # far from every config's seed, so no generated text is one an export chose its score on
PAGE_TITLE = "# Far-OOD text against the served OOD score"


def writing_source_test(count: int) -> list[str]:
    """Sentences of the walk-through model's three kinds of writing (its own task; drawn under a seed)."""
    shift = load_shift_sets()
    texts = [t for name in ("tweets", "nyt_editorials", "amazon_reviews") for t in shift[name].texts]
    return texts[:: max(len(texts) // count, 1)][:count]


def in_distribution(model: str, count: int) -> dict[str, list[str]]:
    """The in-distribution sets a model's flag is read against."""
    amazon = load_shift_sets()["amazon_reviews"].texts[:count]
    if model == "movie-reviews-minilm":
        return {"movie-review test sentences": load_movie_reviews().test.texts[:count], "product reviews": amazon}
    return {"its own kinds of writing": writing_source_test(count)}


def default_version(repository: Path, model: str) -> str:
    return str(max(int(p.name) for p in (repository / model).iterdir() if p.name.isdigit()))


def served_scores(folder: Path, model: str, texts: list[str], work: Path, threads: int) -> list[float]:
    """Each text's served ``ood_score`` from the batch scorer over a repository holding this version alone."""
    repository = work / "repository"
    if not (repository / model).exists():
        shutil.copytree(folder, repository / model / folder.name)
    source, out = work / "in.jsonl", work / "out.jsonl"
    source.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)))
    out.unlink(missing_ok=True)
    if score_file(["--model-repository", str(repository), "--model", model, "--input", str(source), "--output",
                   str(out), "--threads", str(threads)]) != 0:
        raise RuntimeError(f"the batch scorer failed on {model}")
    rows = {row["key"]: row for row in map(json.loads, out.read_text().splitlines())}
    return [rows[str(i)]["ood_score"] for i in range(len(texts))]


def auroc(id_scores: list[float], ood_scores: list[float]) -> float:
    """AUROC with OOD the positive class and a higher score more OOD (the project's convention)."""
    return float(roc_auc_score([0] * len(id_scores) + [1] * len(ood_scores), [*id_scores, *ood_scores]))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    repository = Path(args.repository)
    results: dict[str, Any] = {}
    far = {name: generate(args.count, HELD_OUT_SEED + i)
           for i, (name, (generate, _)) in enumerate(FAR_OOD_KINDS.items())}
    for model in args.models:
        version = default_version(repository, model)
        folder = repository / model / version
        manifest = parse_manifest(read_document(folder))
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            id_scores = {name: served_scores(folder, model, texts, work, args.threads)
                         for name, texts in in_distribution(model, args.count).items()}
            far_scores = {name: served_scores(folder, model, texts, work, args.threads) for name, texts in far.items()}
        table = {id_name: {name: auroc(ids, ood) for name, ood in far_scores.items()}
                 for id_name, ids in id_scores.items()}
        results[model] = {"version": version, "method": manifest.method, "ood_score": manifest.ood.score,
                          "auroc": table}
        print(f"{model} {version} ({manifest.method}, {manifest.ood.score}): {json.dumps(table)}")
    return {"date": date.today().isoformat(), "count": args.count, "seed": HELD_OUT_SEED, "models": results}


def markdown(results: dict[str, Any]) -> str:
    kinds = list(FAR_OOD_KINDS)
    lines = [PAGE_TITLE, "", "```bash", ".venv/bin/python -m benchmarks.far_ood --out docs/benchmarks-far-ood.json "
             "--markdown docs/benchmarks-far-ood.md", "```", "",
             f"Measured {results['date']}: {results['count']} texts per set, the far-OOD kinds generated under seed "
             f"{results['seed']} (no export's), each scored by the batch scorer as the server serves it. AUROC of the "
             "served `ood_score`, in-distribution set (rows) against far-OOD kind (columns).", ""]
    for model, entry in results["models"].items():
        lines += [f"## {model} {entry['version']} ({entry['method']}, `{entry['ood_score']}`)", "",
                  "| in-distribution | " + " | ".join(kinds) + " |", "| --- |" + " --- |" * len(kinds)]
        lines += [f"| {id_name} | " + " | ".join(f"{row[k]:.3f}" for k in kinds) + " |"
                  for id_name, row in entry["auroc"].items()]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", default="model_repository")
    parser.add_argument("--models", nargs="+", default=["movie-reviews-minilm", "writing-source-minilm"])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--markdown", type=Path, required=True)
    args = parser.parse_args()
    results = measure(args)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    args.markdown.write_text(markdown(results))


if __name__ == "__main__":
    main()
