"""A multi-label classifier end to end, as a user runs it: a tiny BERT saved with ``problem_type:
multi_label_classification`` and a tiny ViT likewise, labelled data with several labels per row (a JSON-lines column of
label lists, a CSV with one 0/1 column per label, a CSV of image paths and label lists), one ``calibrate`` command
each, the exported versions' manifests, and a real server
answering them over ``/predict``, the Open Inference Protocol over HTTP (the real tritonclient) and gRPC."""

from __future__ import annotations

import base64
import contextlib
import csv
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import timm
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from PIL import Image

from artifact.contract import FORMAT_VERSION, MANIFEST, parse_manifest
from models.label_recall import RecallTable
from service.batch_scoring import main as score_file
from tests.service.conftest import Running, metric_value, serve, settings_for, wait_for
from tests.service.test_grpc import free_port
from tests.training.calibrate.test_calibrate import calibrate
from tests.training.calibrate.tiny_checkpoints import TOPICS, multi_label_texts, save_multi_label_checkpoint
from training.cli import main
from training.export.verdict import served_path
from training.posthoc.ood_selection import generalising


def write_jsonl(path: Path, rows: list[tuple[str, list[str]]]) -> Path:
    path.write_text("".join(json.dumps({"text": text, "tags": labels}) + "\n" for text, labels in rows))
    return path


def write_columns_csv(path: Path, rows: list[tuple[str, list[str]]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", *TOPICS])
        writer.writerows([text, *(int(t in labels) for t in TOPICS)] for text, labels in rows)
    return path


def write_image_table(folder: Path, count: int) -> Path:
    """``count`` images whose bright colour channels are their labels (a channel per topic), listed in a CSV with
    their labels joined by ``|`` (none: an empty cell)."""
    rng = np.random.default_rng(3)
    (folder / "images").mkdir(parents=True)
    rows = []
    for i in range(count):
        labels = [t for t in TOPICS if rng.random() < 0.4] if i % 6 else []
        pixels = rng.integers(0, 90, (20, 24, 3), dtype=np.uint8)
        for t in labels:
            pixels[..., TOPICS.index(t)] = rng.integers(150, 256, (20, 24), dtype=np.uint8)
        Image.fromarray(pixels, "RGB").save(folder / "images" / f"{i}.png")
        rows.append([f"images/{i}.png", "|".join(labels)])
    with (folder / "images.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows([["image", "tags"], *rows])
    return folder / "images.csv"


@pytest.fixture(scope="module")
def multi_label_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four multi-label versions: a BERT from label lists (the checkpoint's problem_type says multi-label; the
    kernel's verdict decides its path), the same with the hybrid asked for, and from 0/1 columns (DIRECTOR asked for,
    no calibration split, so no label sets), and a ViT from a table of image paths and label lists (the post-hoc path
    asked for)."""
    tmp = tmp_path_factory.mktemp("multi-label")
    rows = multi_label_texts(150, 1)
    bert = str(save_multi_label_checkpoint(tmp / "ckpt" / "bert"))
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        calibrate(tmp, "tags", bert, write_jsonl(tmp / "tags.jsonl", rows), "--label-column", "tags",
                  "--set", "distil.depth_candidates=[1]", method="auto")
    (tmp / "tags-output.txt").write_text(printed.getvalue())
    calibrate(tmp, "tags-hybrid", bert, tmp / "tags.jsonl", "--label-column", "tags", "--set",
              "distil.depth_candidates=[1]", method="hybrid")
    calibrate(tmp, "tag-columns", bert, write_columns_csv(tmp / "tags.csv", rows), "--label-columns",
              ",".join(TOPICS), "--set", "distil.depth_candidates=[1]", "--set", "task.thresholds=fixed",
              "--set", "task.temperature=per_label", "--set", "export.calibration_share=0")
    vit = str(save_multi_label_checkpoint(tmp / "ckpt" / "vit", "vit"))
    calibrate(tmp, "tagged-images", vit, write_image_table(tmp / "pictures", 90), "--label-column", "tags",
              "--set", "distil.depth_candidates=[1]", method="posthoc")
    return tmp


def manifest_of(repo: Path, name: str) -> dict:
    return json.loads((repo / "repo" / name / "1" / MANIFEST).read_text())


def test_the_manifest_says_the_task_thresholds_and_temperatures(multi_label_repo: Path) -> None:
    tags = parse_manifest(manifest_of(multi_label_repo, "tags"))
    assert tags.task == "multi_label" and tags.labels == TOPICS and tags.format_version == FORMAT_VERSION
    assert tags.multi_label is not None and tags.multi_label.threshold_rule == "f1"
    assert len(tags.multi_label.thresholds) == 3 and all(0 < t < 1 for t in tags.multi_label.thresholds)
    assert tags.multi_label.temperature_rule in ("one", "per_label") and len(tags.multi_label.label_ece or []) == 3
    assert tags.conformal is None
    # the OOD score chosen over the OOD-validation families by the single-label rule, each candidate's AUROC recorded
    families = (tags.ood.model_extra or {})["selection_families"]
    table = {name: family["auroc"] for name, family in families.items()}
    weights = {name: family["weight"] for name, family in families.items()}
    candidates = list(next(iter(table.values())))
    assert len(table) >= 2 and "energy" in candidates and "mds" in candidates and "rmds" not in candidates
    assert tags.ood.score == tags.ood.selection_choice == generalising(candidates, table, weights)
    assert tags.reference is not None and tags.reference.ece is not None
    columns = parse_manifest(manifest_of(multi_label_repo, "tag-columns"))
    assert columns.multi_label is not None and columns.multi_label.thresholds == [0.5, 0.5, 0.5]
    assert columns.multi_label.temperature_rule == "per_label" and len(columns.multi_label.temperatures or []) == 3
    assert columns.method == "director" and columns.sampling.depth == 1 and columns.variance is not None
    config = (multi_label_repo / "runs" / "tag-columns" / "calibrate.yaml").read_text()
    assert "kind: multi_label" in config and "label_columns:" in config


def test_the_results_page_lists_each_label(multi_label_repo: Path) -> None:
    page = (multi_label_repo / "repo" / "tags" / "README.md").read_text()
    assert "multi-label" in page and all(f"| {t} |" in page for t in TOPICS)
    verdict = parse_manifest(manifest_of(multi_label_repo, "tags")).kernel_verdict
    assert verdict is not None and verdict.sentence in page and "DIRECTOR against the post-hoc path" in page


@pytest.mark.parametrize(("name", "requested"), [("tags", "auto"), ("tags-hybrid", "hybrid"),
                                                 ("tag-columns", "director"), ("tagged-images", "posthoc")])
def test_each_version_carries_the_kernel_verdict(multi_label_repo: Path, name: str, requested: str) -> None:
    """The three paths compared paired, as for a single-label model: the served path is the verdict's, asked for or
    decided by ``auto``; a post-hoc version runs no kernel and holds one OOD threshold for every sample count, a hybrid
    one too, its scores led by the kernel error."""
    manifest = parse_manifest(manifest_of(multi_label_repo, name))
    verdict = manifest.kernel_verdict
    assert verdict is not None and verdict.requested == requested and manifest.method == verdict.served
    if requested != "auto":
        assert verdict.served == requested
    else:
        assert verdict.served == served_path("auto", verdict.kernel_wins, verdict.pairs)
    assert {(p.richer, p.cheaper) for p in verdict.pairs} == {("hybrid", "posthoc"), ("director", "hybrid")}
    measured = {(c.set, c.metric) for c in verdict.comparisons}
    shift = "rotated validation" if manifest.modality == "image" else "validation with typos"
    assert {("validation", "accuracy"), ("validation", "nll"), ("validation", "ece"), (shift, "nll"),
            (shift, "ece")} <= measured
    assert ("the test split", "accuracy") in measured
    assert any(c.metric == "worst_auroc" for c in verdict.comparisons)
    tests = manifest.provenance.test_metrics if manifest.provenance else {}
    assert {"backbone", "posthoc", "director_minus_posthoc"} <= set(tests)
    if manifest.method in ("posthoc", "hybrid"):
        assert manifest.sampling.depth == 0 and manifest.variance is None
        assert len({t.threshold for t in manifest.ood.thresholds.values()}) == 1
    if manifest.method == "posthoc":
        assert manifest.ood.score != "kernel_error"
    if manifest.method == "hybrid":
        assert manifest.artifact is not None and (manifest.artifact.input_scores or [])[0] == "kernel_error"


@pytest.fixture(scope="module")
def served(multi_label_repo: Path) -> Iterator[tuple[Running, str]]:
    """A real server (uvicorn on loopback, gRPC beside it) over the multi-label versions."""
    port = free_port()
    settings = settings_for(multi_label_repo / "repo", multi_label_repo, default_model="tags", grpc_port=port,
                            max_inputs_per_request=16)
    with serve(settings) as running:
        yield running, f"127.0.0.1:{port}"


TEXTS = ["great superb film", "the plot was dull and fine", "a story"]


@pytest.mark.parametrize("name", ["tags", "tags-hybrid", "tag-columns"])
def test_predict_answers_each_label(served: tuple[Running, str], multi_label_repo: Path, name: str) -> None:
    manifest = parse_manifest(manifest_of(multi_label_repo, name))
    assert manifest.multi_label is not None
    response = httpx.post(f"{served[0].url}/predict", timeout=60,
                          json={"model": name, "inputs": [{"text": t} for t in TEXTS], "n_samples": 3})
    assert response.status_code == 200, response.text
    for prediction in response.json()["predictions"]:
        probabilities = prediction["probabilities"]
        assert set(probabilities) == set(TOPICS) and all(0 <= p <= 1 for p in probabilities.values())
        expected = [t for t, cut in zip(TOPICS, manifest.multi_label.thresholds, strict=True)
                    if probabilities[t] >= cut]
        assert prediction["labels"] == expected
        assert set(prediction["label_entropy"]) == set(TOPICS)
        assert all(0 <= h <= math.log(2) + 1e-6 for h in prediction["label_entropy"].values())
        assert prediction["predictive_entropy"] == pytest.approx(sum(prediction["label_entropy"].values()), rel=1e-4)
        assert all(v >= 0 for v in prediction["label_mutual_information"].values())
        assert isinstance(prediction["is_ood"], bool) and prediction["label"] in TOPICS


def recall_table(repo: Path, name: str) -> RecallTable:
    """The version's label-recall file, as the export wrote it."""
    manifest = parse_manifest(manifest_of(repo, name))
    assert manifest.multi_label is not None and manifest.multi_label.recall is not None
    document = json.loads((repo / "repo" / name / "1" / manifest.multi_label.recall.file).read_text())
    return RecallTable(torch.tensor(document["probabilities"], dtype=torch.float64),
                       torch.tensor(document["weights"], dtype=torch.float64), manifest.multi_label.recall.n)


def test_the_label_sets_are_calibrated_on_the_calibration_split(multi_label_repo: Path) -> None:
    """The served path's true-label probabilities on the carved-off calibration split, one weight each; the test
    split's recall at each reported coverage on the page; none without a calibration split."""
    tags = parse_manifest(manifest_of(multi_label_repo, "tags"))
    assert tags.multi_label is not None and tags.multi_label.recall is not None
    assert "label_recall.json" in tags.files and "recall guarantee" in tags.multi_label.recall.split
    table = recall_table(multi_label_repo, "tags")
    assert len(table.probabilities) == tags.multi_label.recall.entries > 0
    assert float(table.weights.sum()) <= tags.multi_label.recall.n  # one per input with a true label, at most
    measured = (tags.provenance.test_metrics or {})["label_sets"] if tags.provenance else {}
    assert set(measured) == {"0.8", "0.9", "0.95"}
    assert all(0 <= m["recall"] <= 1 and 0 <= m["mean_size"] <= 3 for m in measured.values())
    assert measured["0.95"]["mean_size"] >= measured["0.8"]["mean_size"]
    assert "## Label sets with a recall guarantee" in (multi_label_repo / "repo" / "tags" / "README.md").read_text()
    printed = (multi_label_repo / "tags-output.txt").read_text()
    assert f"label sets at coverage 0.9 (test): mean recall {measured['0.9']['recall']:.3f}" in printed
    columns = parse_manifest(manifest_of(multi_label_repo, "tag-columns"))
    assert columns.multi_label is not None and columns.multi_label.recall is None
    assert "No label sets" in (multi_label_repo / "repo" / "tag-columns" / "README.md").read_text()


@pytest.mark.parametrize("name", ["tags", "tags-hybrid"])
def test_coverage_returns_the_labels_over_the_calibrated_threshold(served: tuple[Running, str],
                                                                  multi_label_repo: Path, name: str) -> None:
    table = recall_table(multi_label_repo, name)
    for coverage in (0.6, 0.9, 0.99):
        response = httpx.post(f"{served[0].url}/predict", timeout=60, json={
            "model": name, "inputs": [{"text": t} for t in TEXTS], "n_samples": 2, "coverage": coverage,
            "widen_if_shifted": False})  # the calibrated sets, whatever the shift signal says of three texts
        assert response.status_code == 200, response.text
        answer = response.json()
        assert {k: v for k, v in answer["decisions"].items() if k != "shift"} == {
            "coverage": coverage, "conformal_score": "label_recall", "class_conditional": False,
            "widen_if_shifted": False}
        lam = table.threshold(coverage)
        for prediction in answer["predictions"]:
            probabilities = prediction["probabilities"]
            expected = sorted((t for t in TOPICS if probabilities[t] >= lam), key=lambda t: -probabilities[t])
            assert prediction["prediction_set"] == expected and prediction["set_size"] == len(expected)
            assert "abstain" not in prediction


def test_live_coverage_is_the_mean_recall_of_the_labelled_sets(served: tuple[Running, str]) -> None:
    """Feedback on a request that asked for coverage joins each input's true labels to its logged set: live coverage
    at that level is their mean recall (the share of an input's true labels its set held; 1 with none), read back
    from the store."""
    url = served[0].url
    answer = httpx.post(f"{url}/predict", timeout=60, json={
        "model": "tags", "inputs": [{"text": t} for t in TEXTS], "coverage": 0.8, "widen_if_shifted": False}).json()
    recalls = []
    for index, prediction in enumerate(answer["predictions"]):
        kept, left = prediction["prediction_set"], [t for t in TOPICS if t not in prediction["prediction_set"]]
        truth = [[*kept[:1], *left[:1]], kept, []][index]  # one held and one missed (if any), all held, none true
        recalls.append(sum(t in kept for t in truth) / len(truth) if truth else 1.0)
        response = httpx.post(f"{url}/feedback", json={"id": answer["id"], "index": index, "label": truth},
                              timeout=30)
        assert response.status_code == 200, response.text
    want = sum(recalls) / len(recalls)

    def shown() -> bool:
        text = httpx.get(f"{url}/metrics", timeout=30).text
        return (metric_value(text, "director_live_coverage_ratio", model="tags", version="1", coverage="0.8")
                == pytest.approx(want) and metric_value(text, "director_live_coverage_count", model="tags",
                                                        version="1", coverage="0.8") == 3.0)

    wait_for(shown, "the multi-label sets' live recall on /metrics", timeout_s=30)


def test_what_a_multi_label_version_cannot_answer_is_refused_with_the_reason(served: tuple[Running, str]) -> None:
    url = served[0].url
    for body, code, reason in (
            ({"max_risk": 0.1}, 400, "multi-label model answers no max_risk"),
            ({"coverage": 0.9, "model": "tag-columns"}, 400, "has no label-recall calibration"),
            ({"coverage": 0.9, "conformal_score": "aps"}, 422, "single-label prediction sets"),
            ({"coverage": 0.3}, 422, "coverage must be in [0.5, 0.999]")):
        response = httpx.post(f"{url}/predict", timeout=60, json={"inputs": [{"text": TEXTS[0]}], **body})
        assert response.status_code == code and reason in response.text, response.text


def test_oip_http_declares_and_answers_the_per_label_outputs(served: tuple[Running, str]) -> None:
    client = triton_http.InferenceServerClient(served[0].url.removeprefix("http://"))
    outputs = {o["name"]: o for o in client.get_model_metadata("tags")["outputs"]}
    assert outputs["predicted"]["shape"] == [-1, 3] and outputs["predicted"]["datatype"] == "BOOL"
    assert outputs["label_entropy"]["shape"] == [-1, 3]
    texts = triton_http.InferInput("text", [len(TEXTS)], "BYTES")
    texts.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
    result = client.infer("tags", [texts])
    probabilities, predicted = result.as_numpy("probabilities"), result.as_numpy("predicted")
    assert probabilities.shape == (3, 3) and predicted.shape == (3, 3) and predicted.dtype == bool
    assert result.as_numpy("label_entropy").shape == (3, 3)
    assert {"prediction_set", "set_size"} <= set(outputs) and "abstain" not in outputs  # label sets, no abstentions
    asked = client.infer("tags", [texts], parameters={"coverage": 0.9},
                         outputs=[triton_http.InferRequestedOutput(n) for n in ("probabilities", "prediction_set")])
    sets = [json.loads(s) for s in asked.as_numpy("prediction_set")]
    assert len(sets) == 3 and all(set(s) <= set(TOPICS) for s in sets)
    config = client.get_model_config("tags")
    assert {o["name"] for o in config["output"]} >= {"predicted", "label_entropy", "label_mutual_information"}
    assert json.loads(config["parameters"]["decision_outputs"]["string_value"]) == {
        "prediction_set": "coverage", "set_size": "coverage", "exchangeable": "coverage or max_risk"}
    assert config["parameters"]["task"]["string_value"] == "multi_label"
    assert len(json.loads(config["parameters"]["label_thresholds"]["string_value"])) == 3


def test_grpc_answers_the_per_label_outputs(served: tuple[Running, str]) -> None:
    client = triton_grpc.InferenceServerClient(served[1])
    metadata = client.get_model_metadata("tags", as_json=True)
    assert "predicted" in {o["name"] for o in metadata["outputs"]}
    texts = triton_grpc.InferInput("text", [len(TEXTS)], "BYTES")
    texts.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
    result = client.infer("tags", [texts], outputs=[triton_grpc.InferRequestedOutput(name)
                                                    for name in ("probabilities", "predicted", "label_entropy")])
    assert result.as_numpy("predicted").shape == (3, 3) and result.as_numpy("probabilities").shape == (3, 3)
    assert (result.as_numpy("label_entropy") >= 0).all()


def test_feedback_takes_the_list_of_true_labels(served: tuple[Running, str], multi_label_repo: Path) -> None:
    url = served[0].url
    answer = httpx.post(f"{url}/predict", timeout=60, json={"inputs": [{"text": TEXTS[0]}], "n_samples": 2}).json()
    predicted = answer["predictions"][0]["labels"]
    response = httpx.post(f"{url}/feedback", json={"id": answer["id"], "label": predicted}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["correct"] is True and response.json()["live_ece"] is None
    wrong = [t for t in TOPICS if t not in predicted][:1] or []
    response = httpx.post(f"{url}/feedback", json={"id": answer["id"], "label": [*predicted, *wrong]}, timeout=30)
    assert response.status_code == 200 and response.json()["correct"] is (not wrong)
    for label, message in (("positive", "takes the list of true labels"), (["funny"], "unknown label 'funny'"),
                           ([7], "label index 7")):
        refused = httpx.post(f"{url}/feedback", json={"id": answer["id"], "label": label}, timeout=30)
        assert refused.status_code == 422 and message in refused.text, refused.text
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    assert 'director_feedback_label_decisions_total{label="negative",model="tags",outcome="correct",version="1"}' \
        in metrics.replace(", ", ",")
    assert "director_predicted_labels_bucket" in metrics
    recall = parse_manifest(manifest_of(multi_label_repo, "tags")).multi_label
    assert recall is not None and recall.recall is not None  # the label sets' calibration inputs, as a gauge
    assert f'director_reference_calibration_inputs{{model="tags",version="1"}} {float(recall.recall.n)}' in metrics


def test_the_batch_scorer_writes_each_label(multi_label_repo: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    source = tmp_path / "texts.jsonl"
    source.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    out = tmp_path / "scores.jsonl"
    assert score_file(["--model-repository", str(multi_label_repo / "repo"), "--model", "tags", "--input",
                       str(source), "--output", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 3 and all(set(line["label_entropy"]) == set(TOPICS) for line in lines)
    assert all(set(line["labels"]) <= set(TOPICS) and len(line["probabilities"]) == 3 for line in lines)
    sets = tmp_path / "sets.jsonl"
    assert score_file(["--model-repository", str(multi_label_repo / "repo"), "--model", "tags", "--input",
                       str(source), "--output", str(sets), "--coverage", "0.9"]) == 0
    assert all(set(json.loads(line)["prediction_set"]) <= set(TOPICS) for line in sets.read_text().splitlines())
    refused = tmp_path / "refused.jsonl"
    assert score_file(["--model-repository", str(multi_label_repo / "repo"), "--model", "tags", "--input",
                       str(source), "--output", str(refused), "--max-risk", "0.1"]) == 2
    assert "a multi-label model answers no max_risk" in capsys.readouterr().err


def test_a_multi_label_vit_is_served(served: tuple[Running, str], multi_label_repo: Path) -> None:
    manifest = parse_manifest(manifest_of(multi_label_repo, "tagged-images"))
    assert manifest.task == "multi_label" and manifest.modality == "image" and manifest.labels == TOPICS
    image = multi_label_repo / "pictures" / "images" / "1.png"
    body = {"model": "tagged-images", "inputs": [{"image_base64": base64.b64encode(image.read_bytes()).decode()}],
            "n_samples": 2}
    response = httpx.post(f"{served[0].url}/predict", json=body, timeout=60)
    assert response.status_code == 200, response.text
    prediction = response.json()["predictions"][0]
    assert set(prediction["labels"]) <= set(TOPICS) and set(prediction["label_entropy"]) == set(TOPICS)
    pixels = np.random.default_rng(0).random((2, 3, 16, 16)).astype(np.float32)
    oip = httpx.post(f"{served[0].url}/v2/models/tagged-images/infer", timeout=60, json={
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [2, 3, 16, 16], "data": pixels.ravel().tolist()}]})
    assert oip.status_code == 200, oip.text
    outputs = {o["name"]: o for o in oip.json()["outputs"]}
    assert outputs["predicted"]["shape"] == [2, 3] and outputs["label_entropy"]["datatype"] == "FP32"


def test_a_timm_vit_is_multi_label_by_the_flag(multi_label_repo: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    """A timm head says nothing of its task: ``--multi-label`` says it (here a dry run: the plan and the config)."""
    torch.manual_seed(0)
    vit = timm.models.VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=3)
    torch.save(vit.state_dict(), tmp_path / "timm-vit.pth")
    args = ["calibrate", "--backbone", "timm:vit_tiny_patch16_224", "--checkpoint", str(tmp_path / "timm-vit.pth"),
            "--data", str(multi_label_repo / "pictures" / "images.csv"), "--label-column", "tags", "--multi-label",
            "--name", "timm-tags", "--run-dir", str(tmp_path / "run"), "--repository", str(tmp_path / "repo"),
            "--dry-run", "--set", f"data.labels=[{','.join(TOPICS)}]",
            "--set", "pretrained.model_args={img_size: 16, patch_size: 4, embed_dim: 32, depth: 2, num_heads: 4}"]
    assert main(args) == 0
    assert "multi-label: counts are rows with the label" in capsys.readouterr().out
    assert "kind: multi_label" in (tmp_path / "run" / "calibrate.yaml").read_text()


def test_the_last_line_of_calibrate_names_the_served_path(multi_label_repo: Path) -> None:
    from training.export.verdict import PATH_NAMES

    last = (multi_label_repo / "tags-output.txt").read_text().strip().splitlines()[-1]
    verdict = parse_manifest(manifest_of(multi_label_repo, "tags")).kernel_verdict
    assert verdict is not None and last.startswith("wrote ")
    assert PATH_NAMES[verdict.served] in last and "(DIRECTOR, the hybrid, the post-hoc path" in last
