"""The text pipeline end to end on a tiny config (tiny BERT, WordPiece vocabulary trained on 640 movie-review
sentences): fit-backbone, distil (and resume), export; the exported artifact, manifest and tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from tokenizers import Tokenizer

from artifact.contract import MANIFEST, parse_manifest, sha256_file, verify_files
from models.text_director import fold_for_artifact
from models.uncertainty import INPUT_SCORES
from tests.conftest import tiny_text_config_dict
from tests.training.pipeline_checks import check_distil_resumes, check_partial_depth, check_runs_isolated
from training.cli import main
from training.config import load_config
from training.data.tokens import TokenSplit, encode, load_run_tokenizer, token_batches
from training.data.unlabeled import load_package_descriptions
from training.distil.stage import unlabeled_inputs
from training.loading import load_data, load_director, run_family
from training.posthoc.writing import load_scripted
from training.runtime import load_checkpoint


@pytest.fixture(scope="module")
def exported(tiny_text_export: tuple[Path, Path]) -> tuple[Path, Path]:
    """The three stages run once for the session (``tiny_text_export``, read only here); returns (config path,
    artifact folder)."""
    return tiny_text_export


def _rows(split: TokenSplit, index: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return split.rows(torch.tensor(index))


def test_stages_write_checkpoints_and_the_tokenizer(exported: tuple[Path, Path]) -> None:
    config, _ = exported
    cfg = load_config(config)
    run = Path(cfg.run_dir)
    backbone = load_checkpoint(run / "backbone.pt")
    director = load_checkpoint(run / "director.pt")
    assert backbone["modality"] == "text" and backbone["labels"] == ["negative", "positive"]
    assert backbone["text_backbone"]["bert_config"]["hidden_size"] == 32
    assert backbone["history"][-1]["train_loss"] < backbone["history"][0]["train_loss"]  # it learns
    assert load_run_tokenizer(run).get_vocab_size() == backbone["text_backbone"]["bert_config"]["vocab_size"]
    assert director["tau"] in cfg.distil.tau_grid and len(director["history"]) == cfg.distil.epochs
    for record in director["history"]:  # per-step statistics over real tokens, one value per layer
        assert len(record["var_obs"]) == len(record["var_p"]) == len(record["mean_sq_error"]) == 2
        assert all(v > 0 for v in record["var_obs"]) and 0.0 <= record["val_accuracy"] <= 1.0
    assert all(f > 0 for f in director["floors"])


def test_distil_resumes_from_its_checkpoint(exported: tuple[Path, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    check_distil_resumes(exported[0], tmp_path, capsys)


def test_distillation_reads_the_unlabeled_corpus_after_the_perturbed_copies(exported: tuple[Path, Path]) -> None:
    cfg = load_config(exported[0], {"distil.l2_target": "teacher", "distil.unlabeled_copies": 1,
                                    "distil.unlabeled_corpus": "debian_descriptions"})
    data = load_data(cfg)
    family = run_family(cfg.run_dir)[0]
    split = unlabeled_inputs(cfg, family, data)
    corpus = load_package_descriptions()
    assert split is not None and len(split) == len(data.train) + len(corpus) > len(data.train)
    assert split.texts[len(data.train):] == corpus and int(split.mask.sum(dim=1).max()) <= cfg.text.max_length
    assert unlabeled_inputs(load_config(exported[0]), family, data) is None  # neither asked for


def test_manifest_follows_the_artifact_contract(exported: tuple[Path, Path]) -> None:
    _, folder = exported
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["format_version"].split(".")[0] == "1"
    assert manifest["modality"] == "text" and manifest["method"] == "director"
    assert manifest["labels"] == ["negative", "positive"]
    text_input = manifest["input"]
    assert text_input["tokenizer"] == "tokenizer.json"
    assert (text_input["max_length"], text_input["max_characters"]) == (32, 200)
    assert text_input["truncation"]["side"] == "right" and text_input["padding"] == {
        "side": "right", "pad_id": 0, "note": text_input["padding"]["note"]}
    assert manifest["sampling"]["default_samples"] == 4 and manifest["sampling"]["depth"] == 2
    assert manifest["sampling"]["noise_scale"] in (0.5, 1.0)
    assert set(manifest["ood"]["thresholds"]) == {"1", "2", "4"}
    assert manifest["ood"]["thresholds"]["1"]["score"] != "mutual_information"
    assert "licences" in manifest["ood"]["selection_set"]  # none of the reported OOD sets
    ref = manifest["reference"]
    # validation less the quarter carved off to calibrate the prediction sets and abstentions (30 of 120)
    assert ref["n_samples"] == 4 and len(ref["confidence_quantiles"]) == 101 and ref["n_inputs"] == 90
    assert ref["confidence_quantiles"] == sorted(ref["confidence_quantiles"])
    assert set(manifest["files"]) == {"director.ts", "tokenizer.json", "conformal.json"}
    assert manifest["conformal"]["n"] == 30 and manifest["conformal"]["default_score"] == "lac"
    assert manifest["files"]["tokenizer.json"]["sha256"] == sha256_file(folder / "tokenizer.json")
    assert verify_files(folder, parse_manifest(manifest)) == []
    table = manifest["artifact"]["word_table"]
    assert table["dtype"] == "int8" and table["bytes"] == table["rows"] * (table["dim"] + 4)
    assert table["argmax_agreement_noise_off"] >= 0.95
    assert "input_ids" in manifest["artifact"]["forward"]
    prov = manifest["provenance"]
    assert {"backbone", "dataset", "config", "seed", "git_commit", "date", "test_metrics"} <= set(prov)
    assert prov["dataset"] == "movie_reviews" and prov["backbone"]["layers"] == 2
    tm = prov["test_metrics"]
    assert set(tm["ood"]) == {"fortunes_quotes", "python_docstrings"} and tm["backbone"]["n"] == 120
    assert set(tm["ood"]["fortunes_quotes"]["auroc_vs_test"]) >= {"max_softmax", "energy", "mean_logvar"}
    assert len(prov["rollout"]["median_std_over_rms"]) == 2
    page = (Path(load_config(exported[0]).export.docs_dir) / "tiny-text.md").read_text()
    assert "sentences)" in page and "images" not in page
    assert "Requirements of the foundation issue" not in page  # those figures are the vision model's


def test_tokenizer_file_round_trips_the_pipeline_ids(exported: tuple[Path, Path]) -> None:
    config, folder = exported
    cfg = load_config(config)
    data = load_data(cfg)  # the ids every stage used (the run's tokenizer.json)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    long_text = "a wonderfully long review " * 40  # over max_characters and max_length
    for split in (data.test.head(20), encode(load_run_tokenizer(cfg.run_dir), [long_text, ""], 200)):
        for i, text in enumerate(split.texts):
            ids = tokenizer.encode(text[: cfg.text.max_characters]).ids
            assert ids == split.ids[i, : int(split.mask[i].sum())].tolist()
    truncated = tokenizer.encode(long_text[:200]).ids
    assert len(truncated) == 32 and truncated[0] == tokenizer.token_to_id("[CLS]")
    assert truncated[-1] == tokenizer.token_to_id("[SEP]")


def test_artifact_matches_the_eager_module(exported: tuple[Path, Path]) -> None:
    config, folder = exported
    cfg = load_config(config)
    eager, _ = load_director(cfg.run_dir)
    manifest = json.loads((folder / MANIFEST).read_text())
    eager.rollout.noise_scale.fill_(manifest["sampling"]["noise_scale"])
    reference = fold_for_artifact(eager, cfg.text.table_dtype, cfg.text.max_length)  # the same int8 table
    served = load_scripted(folder / "director.ts")
    ids, mask = _rows(load_data(cfg).val, [0, 1, 2])
    with torch.no_grad():
        torch.manual_seed(5)
        expected = reference(ids, mask, 6)
        torch.manual_seed(5)
        got = served(ids, mask, 6)
    assert got.shape == (6, 3, 2)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert served.sample_rows(ids, mask, torch.tensor([1, 4, 2])).shape == (7, 2)


def test_exported_artifact_is_padding_invariant(exported: tuple[Path, Path]) -> None:
    """Noise off: the same logits (1e-5) alone and batched with longer texts. Noise on: the mean over 3000 draws of
    the text's probabilities (and of their squares) alone and padded agree within 5 standard errors."""
    config, folder = exported
    val = load_data(load_config(config)).val
    order = torch.argsort(val.lengths)
    short, longer = int(order[0]), [int(i) for i in order[-3:]]
    ids, mask = _rows(val, [short, *longer])
    length = int(mask[0].sum())
    assert length < ids.shape[1]
    served = load_scripted(folder / "director.ts")
    with torch.no_grad():
        torch.manual_seed(0)
        alone = served(ids[:1, :length], mask[:1, :length], 3000)[:, 0].softmax(-1)  # [S, C]
        torch.manual_seed(1)
        padded = served(ids, mask, 3000)[:, 0].softmax(-1)  # [S, C]
        for f_alone, f_padded in ((alone, padded), (alone.square(), padded.square())):
            gap = (f_alone.mean(0) - f_padded.mean(0)).abs()  # [C]
            standard_error = ((f_alone.var(0) + f_padded.var(0)) / 3000).sqrt()  # [C]
            assert bool((gap <= 5 * standard_error + 1e-6).all()), (gap, standard_error)
        served.rollout.noise_scale.fill_(0.0)
        alone_logits = served(ids[:1, :length], mask[:1, :length], 1)  # [1, 1, C]
        padded_logits = served(ids, mask, 1)  # [1, 4, C]
    torch.testing.assert_close(padded_logits[:, :1], alone_logits, atol=1e-5, rtol=0)


def test_artifact_loads_with_torch_alone(exported: tuple[Path, Path]) -> None:
    _, folder = exported
    script = (
        "import sys, torch\n"
        f"m = torch.jit.load({str(folder / 'director.ts')!r})\n"
        "ids = torch.tensor([[2, 40, 41, 42, 3], [2, 50, 3, 0, 0]])\n"
        "mask = (torch.arange(5)[None] < torch.tensor([[5], [3]])).long()\n"
        "out = m(ids, mask, 3)\n"
        "assert out.shape == (3, 2, 2), out.shape\n"
        "assert m.sample_rows(ids, mask, torch.tensor([2, 1])).shape == (3, 2)\n"
        "banned = ('models', 'training', 'service', 'timm', 'transformers', 'tokenizers')\n"
        "assert not any(name.split('.')[0] in banned for name in sys.modules)\n"
        "print('ok')\n"
    )
    check_runs_isolated(script, folder)


def test_length_bucketed_batches_cover_the_split_once() -> None:
    texts = [" ".join(["word"] * n) for n in (1, 9, 3, 7, 2, 8, 4, 6, 5, 10)]
    tokenizer = Tokenizer.from_str(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": {"[PAD]": 0, "[UNK]": 1, "word": 2}, "unk_token": "[UNK]"}}))
    split = encode(tokenizer, texts, 1000, torch.arange(10))
    gen = torch.Generator().manual_seed(0)
    batches = list(token_batches(split, 2, True, gen, bucket=5))
    seen = torch.cat([labels for _, labels in batches])
    assert sorted(seen.tolist()) == list(range(10))
    for (ids, mask), labels in batches:
        assert ids.shape == mask.shape and ids.shape[1] == int(mask.sum(1).max())  # trimmed to the longest
        lengths = split.lengths[labels]
        assert int(lengths.max() - lengths.min()) <= 1  # one window of 5 batches, sorted by length


def test_text_config_checks_and_the_minilm_recipe(tmp_path: Path) -> None:
    cfg = load_config("configs/movie_reviews_minilm.yaml")
    assert cfg.modality == "text" and cfg.is_text and cfg.data.dataset == "movie_reviews"
    assert (cfg.text.backbone, cfg.text.tokenizer, cfg.text.table_dtype) == ("minilm", "minilm", "int8")
    bad = dict(tiny_text_config_dict(tmp_path))
    bad["text"] = {**bad["text"], "backbone": "minilm"}  # MiniLM with a WordPiece vocabulary of its own
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match="tokenizer"):
        load_config(path)
    with pytest.raises(ValueError, match="modality"):
        load_config(path, {"modality": "audio"})


def test_partial_depth_text_artifact_matches_eager_and_ignores_padding(exported: tuple[Path, Path],
                                                                       tmp_path: Path) -> None:
    """Depth 1 of 2: the artifact carries layer 1 as plain modules (the prefix) and equals the eager module under one
    seed; with the noise off a text gives the same logits alone and padded beside a longer one."""
    config, _ = exported
    cfg = load_config(config)
    run, folder = check_partial_depth(config, tmp_path)
    eager, _ = load_director(run)
    manifest = json.loads((folder / MANIFEST).read_text())
    eager.rollout.noise_scale.fill_(manifest["sampling"]["noise_scale"])
    reference = fold_for_artifact(eager, cfg.text.table_dtype, cfg.text.max_length)
    served = load_scripted(folder / "director.ts")
    val = load_data(cfg).val
    order = torch.argsort(val.lengths)
    short, long = int(order[0]), int(order[-1])
    ids, mask = _rows(val, [short, long])
    with torch.no_grad():
        torch.manual_seed(3)
        expected = reference(ids, mask, 4)
        torch.manual_seed(3)
        got = served(ids, mask, 4)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
        served.rollout.noise_scale.fill_(0.0)
        alone = served(*_rows(val, [short]), 1)[0, 0]  # [C]
        padded = served(ids, mask, 1)[0, 0]  # [C]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)


def test_text_deterministic_baseline_exports_compactly_and_loads_in_the_server(exported: tuple[Path, Path],
                                                                                tmp_path: Path) -> None:
    """``export-baseline --method deterministic`` on a text run: the fine-tuned encoder as plain modules (float16
    layers, int8 table) with its tokenizer, passing the server's own validation; its logits are the backbone's."""
    from service.engine.artifact import load_artifact
    from service.engine.device import resolve_device
    from training.cli import main
    from training.loading import load_backbone

    config, _ = exported
    cfg = load_config(config)
    args = ["--config", str(config), "--set", "text.layer_dtype=float16", "--repository", str(tmp_path)]
    assert main(["export-baseline", *args, "--method", "deterministic"]) == 0
    folder = tmp_path / "tiny-text-deterministic" / "1"
    assert (folder / "tokenizer.json").is_file()
    artifact = load_artifact(folder, resolve_device("cpu", False, 1))
    manifest = artifact.manifest.document()
    assert manifest["method"] == "deterministic" and manifest["modality"] == "text"
    assert manifest["input"]["max_length"] == cfg.text.max_length and manifest["temperature"] > 0
    ids, mask = _rows(load_data(cfg).val, [0, 1, 2])
    with torch.no_grad():
        rows = artifact.module.sample_rows(ids, mask, torch.tensor([1, 1, 1]))  # [3, C]
        expected = load_backbone(cfg.run_dir)(ids, mask)  # [3, C]
    torch.testing.assert_close(rows, expected, atol=0.05, rtol=0)  # int8 table and float16 layers
    for method in ("mc_dropout", "kep_svgp"):  # refused before anything is fine-tuned
        with pytest.raises(ValueError, match="deterministic only"):
            main(["export-baseline", *args, "--method", method])


def test_a_temperature_slope_is_fitted_on_validation_and_its_typos(exported: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    """``export.temperature_slope_grid``: every slope's clean and shifted NLL is recorded, and a slope above 0 is
    written as ``temperature_by_score`` over the served score's terms, which the server's manifest check accepts."""
    from service.engine.artifact import manifest_temperature, validate_manifest

    config, _ = exported
    run = tmp_path / "run"
    shutil.copytree(Path(load_config(config).run_dir), run)
    repo = tmp_path / "repo"
    assert main(["export", "--config", str(config), "--set", f"run_dir={run}", "--set", f"export.repository={repo}",
                 "--set", f"export.docs_dir={tmp_path / 'docs'}",
                 "--set", "export.temperature_slope_grid=[0.5, 4.0]"]) == 0
    (folder,) = (repo / load_config(config).export.name).iterdir()
    document = json.loads((folder / MANIFEST).read_text())
    fit = document["provenance"]["temperature_fit"]["by_score"]
    manifest = validate_manifest(document)
    terms = {term.score for term in manifest.ood.combination or []} or {manifest.ood.score}
    if not terms <= set(INPUT_SCORES):  # the served score reads the logits
        assert fit["slope"] == 0 and "reads the logits" in fit["not_fitted"]
        assert manifest.temperature_by_score is None
        return
    assert fit["fitted_on"] == "validation + validation with typos" and set(fit["fit"]) == {"0", "0.5", "4"}
    eligible = [slope for slope, row in fit["fit"].items() if row["eligible"]]
    assert fit["fit"][f"{fit['slope']:g}"]["shift_nll"] == min(fit["fit"][s]["shift_nll"] for s in eligible)
    if fit["slope"] == 0:
        assert manifest.temperature_by_score is None
    else:
        assert manifest.temperature_by_score is not None and manifest.temperature_by_score.slope == fit["slope"]
        assert manifest_temperature(manifest).base == manifest.temperature
