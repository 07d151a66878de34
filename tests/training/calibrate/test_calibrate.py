"""``python -m training calibrate`` end to end, as a user runs it: a tiny checkpoint of every family saved as users keep
them, a CSV or an image folder, one command each, and the exported models served over HTTP by a real server
(``/predict`` and the Open Inference Protocol). Also the dry run and the errors a user meets first."""

from __future__ import annotations

import base64
import io
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import numpy as np
import pytest
import timm
import torch
from PIL import Image

from artifact.contract import MANIFEST, parse_manifest
from tests.service.conftest import Running, serve, settings_for
from tests.training.calibrate.tiny_checkpoints import (
    CLASSES,
    image,
    save_text_checkpoint,
    save_vit_checkpoint,
    texts,
    write_csv,
    write_image_folder,
)
from training.cli import main
from training.config import load_config
from training.data import ood_families
from training.posthoc.writing import source_record

TINY = ["--set", "distil.epochs=1", "--set", "distil.batch_size=32", "--set", "distil.warmup_steps=2",
        "--set", "distil.tau_images=40", "--set", "distil.stats_batches=1", "--set", "distil.val_images=40",
        "--set", "distil.val_samples=2", "--set", "export.threshold_images=40",
        "--set", "export.ood_validation_images=30", "--set", "export.sample_counts=[1,2,4]",
        "--set", "export.default_samples=2", "--set", "export.max_samples=8",
        "--set", "export.noise_scale_grid=[1.0]", "--set", "evaluate.ood_images=30", "--set", "threads=1",
        "--set", "fit.epochs=1"]
TEXT_FAMILIES = {"tiny-bert": "bert", "tiny-roberta": "roberta", "tiny-distilbert": "distilbert",
                 "tiny-qwen2": "qwen2", "tiny-llama": "llama"}
COLOURS = ["red", "green", "blue"]


def calibrate(tmp: Path, name: str, backbone: str, data: Path, *extra: str, method: str = "director") -> None:
    """``calibrate`` on tiny settings; DIRECTOR is served whatever the kernel's verdict (a tiny kernel's verdict is
    what tests/training/export/test_verdict.py measures) unless ``method`` says otherwise."""
    args = ["calibrate", "--backbone", backbone, "--data", str(data), "--name", name, "--run-dir",
            str(tmp / "runs" / name), "--repository", str(tmp / "repo"), "--method", method, *TINY, *extra]
    assert main(args) == 0


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every family calibrated into one repository: five text checkpoints (one BERT without a head, so a head is
    fitted), a Hugging Face ViT, a Hugging Face DeiT with its distillation head and a timm ViT on an image folder."""
    tmp = tmp_path_factory.mktemp("calibrate")
    reviews = write_csv(tmp / "reviews.csv", texts(150, 1))
    far = tmp / "far-texts.txt"  # the user's own OOD-validation set for one of them
    far.write_text("\n".join(f"def function_{i}(x): return x * {i}" for i in range(40)) + "\n\n")
    for name, kind in TEXT_FAMILIES.items():
        depths = "[1,2]" if kind == "bert" else "[1]"
        own = ["--ood-validation", str(far)] if kind == "roberta" else []
        calibrate(tmp, name, str(save_text_checkpoint(tmp / "ckpt" / name, kind)), reviews,
                  "--set", f"distil.depth_candidates={depths}", *own,
                  method="posthoc" if kind == "distilbert" else "director")
    bare = save_text_checkpoint(tmp / "ckpt" / "bare-bert", "bert", head=False)
    calibrate(tmp, "tiny-bare-bert", str(bare), reviews, "--set", "distil.depth_candidates=[1]")
    folder = write_image_folder(tmp / "images", per_class=30)
    calibrate(tmp, "tiny-vit", str(save_vit_checkpoint(tmp / "ckpt" / "vit")), folder)
    noise = tmp / "far-images" / "noise"  # one subfolder deep: every PNG / JPEG under the folder is read
    noise.mkdir(parents=True)
    for i in range(12):
        rng = np.random.default_rng(100 + i)
        Image.fromarray(rng.integers(0, 256, (9 + i, 13, 3), dtype=np.uint8)).save(noise / f"{i}.png")
    calibrate(tmp, "tiny-deit", str(save_vit_checkpoint(tmp / "ckpt" / "deit", "deit")), folder,
              "--set", "distil.depth_candidates=[1]", "--ood-validation", str(tmp / "far-images"))
    torch.manual_seed(0)
    vit = timm.models.VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=3)
    torch.save(vit.state_dict(), tmp / "ckpt" / "timm-vit.pth")
    calibrate(tmp, "tiny-timm-vit", "timm:vit_tiny_patch16_224", folder, "--checkpoint",
              str(tmp / "ckpt" / "timm-vit.pth"), "--set", "distil.depth_candidates=[1]",
              "--set", "pretrained.model_args={img_size: 16, patch_size: 4, embed_dim: 32, depth: 2, num_heads: 4}",
              "--set", "data.labels=[red,green,blue]")  # a timm head names no classes: given in its order
    return tmp


@pytest.fixture(scope="module")
def server(calibrated: Path) -> Iterator[Running]:
    settings = settings_for(calibrated / "repo", calibrated, default_model="tiny-bert", max_inputs_per_request=16)
    with serve(settings) as running:
        yield running


def png(label: int) -> str:
    buffer = io.BytesIO()
    image(label, np.random.default_rng(label), (24, 20)).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize("name", [*TEXT_FAMILIES, "tiny-bare-bert"])
def test_a_calibrated_text_model_is_served(server: Running, name: str) -> None:
    body = {"model": name, "inputs": [{"text": t} for t, _ in texts(4, 9)], "n_samples": 3}
    response = httpx.post(f"{server.url}/predict", json=body, timeout=60)
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["model"] == name and out["model_version"] == "1" and out["n_samples"] == 3
    for prediction in out["predictions"]:
        assert prediction["label"] in CLASSES and set(prediction["probabilities"]) == set(CLASSES)
        assert abs(sum(prediction["probabilities"].values()) - 1.0) < 1e-4
        assert prediction["mutual_information"] >= 0.0 and isinstance(prediction["is_ood"], bool)
    oip = httpx.post(f"{server.url}/v2/models/{name}/infer", timeout=60, json={
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a great film", "dull plot"]}]})
    assert oip.status_code == 200, oip.text
    outputs = {o["name"]: o for o in oip.json()["outputs"]}
    assert outputs["probabilities"]["shape"] == [2, 3] and set(outputs["label"]["data"]) <= set(CLASSES)


@pytest.mark.parametrize("name", ["tiny-vit", "tiny-deit", "tiny-timm-vit"])
def test_a_calibrated_image_model_is_served(server: Running, name: str) -> None:
    response = httpx.post(f"{server.url}/predict", timeout=60, json={
        "model": name, "inputs": [{"image_base64": png(i)} for i in range(3)], "n_samples": 2})
    assert response.status_code == 200, response.text
    assert all(p["label"] in COLOURS for p in response.json()["predictions"])
    pixels = np.random.default_rng(0).random((2, 3, 16, 16)).astype(np.float32)
    oip = httpx.post(f"{server.url}/v2/models/{name}/infer", timeout=60, json={
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [2, 3, 16, 16],
                    "data": pixels.ravel().tolist()}]})
    assert oip.status_code == 200, oip.text


def test_manifests_record_the_family_depth_and_checkpoint(calibrated: Path) -> None:
    selection = json.loads((calibrated / "runs" / "tiny-bert" / "depth_selection.json").read_text())
    assert set(selection["validation_nll"]) == {"1", "2"} and selection["chosen"] in (1, 2)
    for name in [*TEXT_FAMILIES, "tiny-bare-bert", "tiny-vit", "tiny-deit", "tiny-timm-vit"]:
        manifest = parse_manifest(json.loads((calibrated / "repo" / name / "1" / MANIFEST).read_text()))
        assert manifest.labels == (COLOURS if "vit" in name or "deit" in name else CLASSES)
        assert manifest.kernel_verdict is not None
        if name == "tiny-distilbert":  # --method posthoc: the backbone's own forward, the verdict still measured
            assert manifest.method == "posthoc" and manifest.sampling.depth == 0
            assert manifest.kernel_verdict.requested == "posthoc" and manifest.kernel_verdict.comparisons
        else:
            assert manifest.method == "director" and manifest.sampling.depth >= 1
    bert = parse_manifest(json.loads((calibrated / "repo" / "tiny-bert" / "1" / MANIFEST).read_text()))
    assert bert.sampling.depth == selection["chosen"]
    assert "tiny-bert" in str(bert.provenance.backbone["kind"]) or "ckpt" in str(bert.provenance.backbone["kind"])
    sources = json.loads((calibrated / "repo" / "tiny-bert" / "1" / MANIFEST).read_text())["provenance"]["sources"]
    assert sources["checkpoint"]["source"] == str(calibrated / "ckpt" / "tiny-bert")
    assert sources["data"]["source"] == str(calibrated / "reviews.csv") and len(sources["data"]["sha256"]) == 64
    for name, own in [("tiny-roberta", "far-texts.txt"), ("tiny-deit", "far-images"), ("tiny-bert", None)]:
        ood = parse_manifest(json.loads((calibrated / "repo" / name / "1" / MANIFEST).read_text())).ood
        assert ood.selection_set is not None
        if own is None:
            assert "Debian software licences" in ood.selection_set
        else:  # the user's set is one more family: named in the manifest, every candidate scored on it
            assert f"{own} (the user's OOD validation set" in ood.selection_set
            families = (ood.model_extra or {})["selection_families"]
            assert families["user_ood_validation"]["weight"] == 1.0
            # one more than the built-in ones (a text family the tiny tokenizer reads too few of is left out)
            built_in = len(families) - 1
            assert (built_in == ood_families.IMAGE_FAMILIES if name == "tiny-deit"
                    else 3 <= built_in <= ood_families.TEXT_FAMILIES)
            assert ood.selection_auroc and all(v is None or 0 <= v <= 1 for v in ood.selection_auroc.values())
    timm_sources = json.loads((calibrated / "repo" / "tiny-timm-vit" / "1" / MANIFEST).read_text())["provenance"][
        "sources"]
    assert timm_sources["checkpoint"] == {"source": "timm:vit_tiny_patch16_224"}
    assert len(timm_sources["checkpoint_weights"]["sha256"]) == 64


class Done(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture) -> Callable[..., Done]:
    """``python -m training ARGS`` in this process: its exit status and what it printed."""

    def run(*args: str) -> Done:
        status = main(list(args))
        out = capsys.readouterr()
        return Done(status, out.out, out.err)

    return run


def test_depths_distil_under_torchrun(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """``--nproc-per-node 2``: the depth's distillation runs in two gloo ranks under torchrun, then exports."""
    reviews = write_csv(tmp_path / "reviews.csv", texts(90, 3))
    calibrate(tmp_path, "ddp", str(save_text_checkpoint(tmp_path / "ckpt", "bert")), reviews, "--nproc-per-node", "2",
              "--set", "distil.depth_candidates=[1]", "--set", "distil.max_steps=2")
    assert "torch.distributed.run --standalone --nproc_per_node=2" in capfd.readouterr().out
    assert (tmp_path / "runs" / "ddp" / "depth-1" / "distil.yaml").is_file()
    manifest = parse_manifest(json.loads((tmp_path / "repo" / "ddp" / "1" / MANIFEST).read_text()))
    assert manifest.sampling.depth == 1 and manifest.labels == CLASSES


def test_dry_run_prints_the_plan_and_trains_nothing(tmp_path: Path, run_cli: Callable[..., Done]) -> None:
    checkpoint = save_text_checkpoint(tmp_path / "ckpt", "qwen2")
    data = write_csv(tmp_path / "reviews.csv", texts(60, 2))
    done = run_cli("calibrate", "--backbone", str(checkpoint), "--data", str(data), "--name", "plan",
                   "--run-dir", str(tmp_path / "run"), "--repository", str(tmp_path / "repo"), "--dry-run")
    assert done.returncode == 0, done.stderr
    for expected in ("family            decoder (text), 2 layers", "depth candidates  K in [1, 2]", "tokens",
                     "time (estimate)", "memory (estimate)", "disk (estimate)", "negative", "dry run"):
        assert expected in done.stdout, (expected, done.stdout)
    assert not (tmp_path / "run" / "backbone.pt").exists() and not (tmp_path / "repo").exists()


def test_an_unsupported_checkpoint_is_refused_by_name(tmp_path: Path, run_cli: Callable[..., Done]) -> None:
    from transformers import GPT2Config, GPT2ForSequenceClassification

    GPT2ForSequenceClassification(GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=50)).save_pretrained(tmp_path)
    done = run_cli("calibrate", "--backbone", str(tmp_path), "--data", "x.csv", "--name", "gpt", "--dry-run")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "model_type 'gpt2' is not supported" in done.stderr and "decoder: qwen2, llama" in done.stderr


def test_what_the_server_could_not_serve_is_refused_at_plan_time(tmp_path: Path, run_cli: Callable[..., Done]) -> None:
    """A RoBERTa folder saved without its tokenizer (transformers then builds one of its five special tokens alone,
    which reads every text as ``<s></s>``) is refused by the dry run and by the run, naming the missing files and what
    to add; so are a max_length the server's own tokenizer check refuses and a text read as special tokens alone."""
    reviews = write_csv(tmp_path / "reviews.csv", texts(60, 2))

    def dry_run(checkpoint: Path, data: Path, *extra: str) -> Done:
        return run_cli("calibrate", "--backbone", str(checkpoint), "--data", str(data), "--name", "refused",
                       "--run-dir", str(tmp_path / "run"), "--repository", str(tmp_path / "repo"), *extra)

    no_tokenizer = save_text_checkpoint(tmp_path / "roberta", "roberta", tokenizer=False)
    for extra in (["--dry-run"], TINY):
        done = dry_run(no_tokenizer, reviews, *extra)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert "no tokenizer files (vocab.json, merges.txt, tokenizer.json missing)" in done.stderr, done.stderr
        assert "reads every text as those alone" in done.stderr and "tokenizer.save_pretrained" in done.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "repo").exists()
    bert = save_text_checkpoint(tmp_path / "bert", "bert")
    done = dry_run(bert, reviews, "--dry-run", "--set", "text.max_length=2")
    assert done.returncode == 2
    assert "the server would refuse to load the model: max_length 2 leaves no room beside the tokenizer's special " \
           "tokens" in done.stderr, done.stderr
    control = write_csv(tmp_path / "control.csv", [*texts(30, 3), ("\x07\x07", "neutral")])
    done = dry_run(bert, control, "--dry-run")
    assert done.returncode == 2
    assert "reads nothing but its special tokens in 1" in done.stderr and "'\\x07\\x07'" in done.stderr, done.stderr


def test_data_that_does_not_fit_the_head_is_refused_before_training(tmp_path: Path,
                                                                    run_cli: Callable[..., Done]) -> None:
    checkpoint = save_text_checkpoint(tmp_path / "ckpt", "bert")
    unknown = write_csv(tmp_path / "unknown.csv", [*texts(30, 3), ("a fine film", "mixed")])
    done = run_cli("calibrate", "--backbone", str(checkpoint), "--data", str(unknown), "--name", "bad",
                   "--run-dir", str(tmp_path / "run"), "--dry-run")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "mixed" in done.stderr and "row 31" in done.stderr
    two = write_csv(tmp_path / "two.csv", [(t, "a" if i % 2 else "b") for i, (t, _) in enumerate(texts(30, 4))])
    bare = save_text_checkpoint(tmp_path / "generic", "bert")
    config = json.loads((bare / "config.json").read_text())
    config["id2label"] = {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}
    (bare / "config.json").write_text(json.dumps(config))
    done = run_cli("calibrate", "--backbone", str(bare), "--data", str(two), "--name", "bad2",
                   "--run-dir", str(tmp_path / "run2"), "--dry-run")
    assert done.returncode == 2 and "3 classes" in done.stderr, done.stderr


def test_image_folder_is_converted_as_the_server_converts_uploads(calibrated: Path) -> None:
    manifest = json.loads((calibrated / "repo" / "tiny-vit" / "1" / MANIFEST).read_text())
    assert manifest["input"]["height"] == 16 and manifest["input"]["channels"] == 3
    assert "bilinear" in manifest["input"]["convert"]["resize"]
    assert Image.open(io.BytesIO(base64.b64decode(png(0)))).size == (24, 20)


def test_a_text_the_tokenizer_reads_nothing_in_is_refused(server: Running, calibrated: Path) -> None:
    """A decoder's tokenizer adds no special token, so a text can hold no token for it (here, capitals its
    normaliser keeps and its vocabulary lacks): the server answers 422 naming the input, and the pipeline's encoding
    refuses it instead of pooling nothing."""
    from tokenizers import Tokenizer

    from training.data.tokens import encode, readable

    response = httpx.post(f"{server.url}/predict", timeout=60, json={
        "model": "tiny-qwen2", "inputs": [{"text": "a great film"}, {"text": "GREAT FILM"}]})
    assert response.status_code == 422, response.text
    assert "inputs.1.text: the model's tokenizer reads no token" in response.text and "Traceback" not in response.text
    tokenizer = Tokenizer.from_file(str(calibrated / "repo" / "tiny-qwen2" / "1" / "tokenizer.json"))
    assert readable(tokenizer, ["a great film", "GREAT FILM"]) == ["a great film"]
    with pytest.raises(ValueError, match="reads no token in 1 texts"):
        encode(tokenizer, ["a great film", "GREAT FILM"], 100)


def test_a_failed_dry_run_changes_nothing_the_next_run_does(tmp_path: Path, run_cli: Callable[..., Done]) -> None:
    """A dry run with the wrong columns fails; the corrected commands that follow use what they say (another data
    file, then the right columns), and none of them claims to resume anything: nothing was trained."""
    checkpoint = save_text_checkpoint(tmp_path / "ckpt", "bert")
    sources = write_csv(tmp_path / "sources.csv", texts(60, 2), "sentence", "source")
    reviews = write_csv(tmp_path / "reviews.csv", texts(60, 3))
    config = tmp_path / "run" / "calibrate.yaml"

    def dry_run(data: Path, *extra: str) -> Done:
        return run_cli("calibrate", "--backbone", str(checkpoint), "--data", str(data), "--name", "rerun",
                       "--run-dir", str(tmp_path / "run"), "--repository", str(tmp_path / "repo"), "--dry-run", *extra)

    failed = dry_run(sources)
    assert failed.returncode == 2 and "text" in failed.stderr
    for data, extra in ((reviews, []), (sources, ["--text-column", "sentence", "--label-column", "source"])):
        done = dry_run(data, *extra)
        assert done.returncode == 0, done.stderr
        assert f"Data: file {data}" in done.stdout and "resum" not in done.stdout
        assert load_config(config).data.root == str(data)


def test_a_rerun_over_trained_files_does_what_the_command_says(calibrated: Path, tmp_path: Path,
                                                               run_cli: Callable[..., Done],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from a copy of the project's docs with the default run folder and repository, as a user runs it, over a
    copy of tiny-bert's trained run: another --data is refused (naming it, the run's, and --no-resume) and changes
    nothing; a dry run with the run's own inputs would resume; with --no-resume the run trains on the new data. The
    results page and its plot go to the run folder and the model's card, the last line names the version written, and
    docs/ is byte for byte as it was."""
    root = Path(__file__).resolve().parents[3]
    shutil.copytree(root / "docs", tmp_path / "docs")
    docs = source_record(str(tmp_path / "docs"))
    shutil.copytree(calibrated / "runs" / "tiny-bert", tmp_path / "runs" / "tiny-bert", symlinks=True)
    monkeypatch.chdir(tmp_path)
    config = Path("runs/tiny-bert/calibrate.yaml")
    recorded = config.read_text()
    other = write_csv(tmp_path / "other.csv", texts(90, 7))
    command = ["calibrate", "--backbone", str(calibrated / "ckpt" / "tiny-bert"), "--name", "tiny-bert", *TINY,
               "--set", "distil.depth_candidates=[1]", "--method", "director"]
    for dry in (["--dry-run"], []):
        refused = run_cli(*command, "--data", str(other), *dry)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert f"--data {other} (the run's: {calibrated / 'reviews.csv'})" in refused.stderr, refused.stderr
        assert "--no-resume" in refused.stderr and config.read_text() == recorded
    swapped = run_cli(*command, "--data", str(calibrated / "reviews.csv"), "--backbone",
                      str(calibrated / "ckpt" / "tiny-roberta"), "--label-column", "class", "--dry-run")
    assert swapped.returncode == 2 and f"--backbone {calibrated / 'ckpt' / 'tiny-roberta'} (the run's: " in \
        swapped.stderr and "--label-column class (the run's: label)" in swapped.stderr, swapped.stderr
    resumed = run_cli(*command, "--data", str(calibrated / "reviews.csv"), "--dry-run")
    assert resumed.returncode == 0 and "dry run: nothing trained or written; the run resumes from backbone.pt" in \
        resumed.stdout and "resuming" not in resumed.stdout and config.read_text() == recorded
    done = run_cli(*command, "--data", str(other), "--no-resume")
    assert done.returncode == 0, done.stderr
    manifest = json.loads(Path("model_repository/tiny-bert/1/manifest.json").read_text())
    assert manifest["provenance"]["sources"]["data"]["source"] == str(other)
    assert "resuming" not in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("wrote model_repository/tiny-bert/1: tiny-bert version 1")
    page = Path("runs/tiny-bert/tiny-bert.md").read_text()
    assert Path("model_repository/tiny-bert/README.md").read_text() == page
    assert "![reliability diagram](tiny-bert-reliability.png)" in page
    assert Path("model_repository/tiny-bert/tiny-bert-reliability.png").is_file()
    assert "foundation issue" not in page and "required" not in page  # the project's targets are not the user's
    assert source_record(str(tmp_path / "docs")) == docs


def test_a_label_column_with_too_many_labels_is_refused_in_a_few_words(tmp_path: Path,
                                                                        run_cli: Callable[..., Done]) -> None:
    """An id column given as the labels: refused at the row that passes the classes allowed (``data.max_classes``
    without a head, the head's count with one), the first few labels named, never every count; a missing column
    names the flags."""
    ids = write_csv(tmp_path / "ids.csv", [(t, f"id-{i}") for i, (t, _) in enumerate(texts(300, 5))])

    def dry_run(checkpoint: Path, *extra: str) -> Done:
        return run_cli("calibrate", "--backbone", str(checkpoint), "--data", str(ids), "--name", "ids", "--run-dir",
                       str(tmp_path / "run"), "--dry-run", *extra)

    bare = dry_run(save_text_checkpoint(tmp_path / "bare", "bert", head=False), "--set", "data.max_classes=20")
    assert bare.returncode == 2 and len(bare.stderr.splitlines()[-1]) < 500, bare.stderr
    assert f"{ids}, row 21 (line 22): more than 20 distinct labels in the column 'label' by this row (at most " \
           "data.max_classes = 20 without a head; --set data.max_classes=N allows more); the first are 'id-0', " \
           "'id-1'" in bare.stderr and "--label-column names it" in bare.stderr
    generic = save_text_checkpoint(tmp_path / "generic", "bert")
    config = json.loads((generic / "config.json").read_text())
    config["id2label"] = {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}  # a head that names no classes
    (generic / "config.json").write_text(json.dumps(config))
    headed = dry_run(generic)
    assert headed.returncode == 2 and "row 4 (line 5): more than 3 distinct labels" in headed.stderr
    assert "the checkpoint's head has 3 classes" in headed.stderr, headed.stderr
    columns = dry_run(generic, "--label-column", "source")
    assert columns.returncode == 2 and "has no column 'source'" in columns.stderr
    assert "with --text-column and the labels' with --label-column (now 'text' and 'source')" in columns.stderr
