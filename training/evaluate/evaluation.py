"""What every evaluation stage shares: the compared methods, the models they read from (each behind the artifact
contract, its sampled logits cached on disk by ``training.evaluate.logit_cache``), the input sets, and what one stage
hands the next (DIRECTOR's per-input scores, its served score, each method's OOD flag rule)."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from artifact.contract import MANIFEST, Ood, parse_manifest, read_document
from models.baselines import DeterministicModel, EnsembleModel, MCDropoutModel
from models.hybrid import hybrid_from_director
from models.posthoc import posthoc_from_director
from models.uncertainty import COMBINED, ScoreTemperature, ScoreTerm, UncertaintySummary, summarize
from training.baselines.builders import build_baseline, ensemble_members, member_config
from training.baselines.kep_svgp import KEP_SVGP_FILE, kep_svgp_dir
from training.config import PipelineConfig
from training.data.held_out_shift import held_out_shift
from training.evaluate.logit_cache import LogitCache, fingerprint
from training.evaluate.sets import EvalInputs, load_eval_inputs
from training.loading import (
    BACKBONE_FILE,
    DIRECTOR_FILE,
    AnySplit,
    RunBackbone,
    split_sampled_logits,
)
from training.posthoc.calibration import fit_temperature
from training.posthoc.feature_statistics import attach_feature_scores
from training.posthoc.modality_parts import backbone_path_builder, with_teacher
from training.posthoc.ood_selection import Candidate, InputScores, combination_label, split_input_scores
from training.posthoc.served_path import fit_served_path
from training.posthoc.served_statistics import fit_noise_scale, fit_noise_shape
from training.posthoc.writing import json_safe
from training.runtime import save_checkpoint

DetectorScores = dict[str, torch.Tensor]  # set name -> [N, detectors] (``training.evaluate.detectors``)
POSTHOC, HYBRID = "posthoc", "hybrid"
# method family -> the source of its per-input scores
SCORED_FAMILIES = {"director": "director", POSTHOC: POSTHOC, HYBRID: HYBRID}
BACKBONE_PATHS = {POSTHOC: ("Post-hoc path", posthoc_from_director), HYBRID: ("Hybrid", hybrid_from_director)}


@dataclass(frozen=True)
class Method:
    key: str  # stable id in the JSON
    label: str  # name in the tables
    source: str  # which model's cached logits it reads
    n_samples: int
    temperature: float = 1.0
    family: str = "director"  # deterministic | mc_dropout | ensemble | kep_svgp | posthoc | hybrid | director
    by_score: ScoreTemperature | None = None  # a temperature per input instead (an exported version's), base included


@dataclass
class Source:
    """A model behind the artifact contract and the fingerprint of what it was built from."""

    model: torch.nn.Module
    model_id: str
    draws: int  # samples drawn per input on every set (test draws max(sweep) for the sweep)


def family_set(name: str) -> str:
    """The set name (logit cache, per-input scores) of the OOD-validation family ``name``."""
    return f"ood_family_{name}"


def summary_of(logits: torch.Tensor, method: Method, inputs: InputScores | None = None) -> UncertaintySummary:
    """The method's summary of its sampled logits [S, N, C]; ``inputs`` are DIRECTOR's per-input scores of the same
    set, which a method with a temperature per input reads."""
    if method.by_score is None:
        return summarize(logits[: method.n_samples], method.temperature)
    if inputs is None:
        raise ValueError(f"{method.label}: its temperature reads DIRECTOR's per-input scores; none were given")
    return summarize(logits[: method.n_samples], method.by_score(inputs))


class Evaluation:
    """Holds the input sets, the models and the logit cache of one evaluation run."""

    def __init__(self, cfg: PipelineConfig) -> None:
        self.cfg = cfg
        self.ev = cfg.evaluate
        self.run_dir = Path(cfg.run_dir)
        self.inputs: EvalInputs = load_eval_inputs(cfg)
        self.cache = LogitCache(self.run_dir / "eval" / "logits")
        self.sources: dict[str, Source] = {}
        self.input_scores: dict[tuple[str, str], InputScores] = {}  # (source, set) -> its per-input scores
        self.served_scores: dict[str, torch.Tensor] = {}  # set name -> the served score [N] (``served_score_method``'s)
        self.served_score_method = "director_s1"  # DIRECTOR at S = 1, or the served version's row when evaluated
        self.chosen_scores: dict[str, dict[str, torch.Tensor]] = {}  # method key -> set -> its own OOD score [N]
        self.flag_rules: dict[str, tuple[Candidate, float]] = {}  # method key -> its OOD score and 95%-TPR threshold
        self.served: dict[str, Any] = {}  # the exported version's sampling (``add_served_source``), when evaluated
        self.posthoc_fit: dict[str, Any] = {}  # the post-hoc path's fitted tools (``backbone_path_method``)
        self._opened: RunBackbone | None = None

    @property
    def opened(self) -> RunBackbone:
        """The run's backbone, its family and views: ``backbone.pt`` read once for the whole evaluation."""
        if self._opened is None:
            self._opened = RunBackbone.open(self.run_dir)
        return self._opened

    # --- models -----------------------------------------------------------------------------------------
    def add_source(self, name: str, model: torch.nn.Module, model_id: str, draws: int) -> None:
        self.sources[name] = Source(model.eval(), model_id, draws)

    def source_input_scores(self, source: str, set_name: str, split: AnySplit) -> InputScores | None:
        """A source's per-input scores on a set, as its artifact's ``scored_rows`` returns them (DIRECTOR: the kernel
        error and the feature-space scores; the post-hoc path: the feature-space scores, none when the run fits
        none), computed once."""
        if (source, set_name) not in self.input_scores:
            self.input_scores[(source, set_name)] = split_input_scores(self.sources[source].model, split)
        return self.input_scores[(source, set_name)]

    def director_input_scores(self, set_name: str, split: AnySplit) -> InputScores:
        """DIRECTOR's per-input scores: it always has the kernel error (``build_sources`` gives it the backbone's
        last transitions)."""
        scores = self.source_input_scores("director", set_name, split)
        assert scores is not None
        return scores

    def native_scores(self, method: Method, set_name: str, split: AnySplit) -> InputScores | None:
        """The per-input scores ``method`` reads (its OOD score candidates, its temperature per input), or None for a
        baseline whose artifact returns none. Every DIRECTOR row reads DIRECTOR's: its noise moves no such score."""
        source = SCORED_FAMILIES.get(method.family)
        return None if source is None else self.source_input_scores(source, set_name, split)

    def detector_scores(self, source: Source, sets: dict[str, AnySplit], compute: Callable[[], DetectorScores]
                        ) -> DetectorScores:
        """A method's detector scores [N, 6] on ``sets`` (``compute()`` fits and scores them all), cached on disk."""
        key = f"{source.model_id}-detectors-s{source.draws}"
        names = sorted(sets)
        paths = [self.cache.folder / f"{key}__{self.cache_name(name)}.pt" for name in names]
        if all(path.exists() for path in paths):
            return {name: torch.load(path, weights_only=True)["scores"]
                    for name, path in zip(names, paths, strict=True)}
        scores = compute()
        for name, path in zip(names, paths, strict=True):
            save_checkpoint(path, {"scores": scores[name]})
        return scores

    def cache_name(self, set_name: str) -> str:
        """The name a set's logits and scores are cached under on disk: validation's says how much of it was carved
        off for the calibration split (``training.data.calibration_split``), and the calibration split's its share, so a
        changed share never reads the rows of another."""
        share = self.cfg.export.calibration_share
        if set_name == "calibration":
            return f"calibration{share:g}"
        return f"{set_name}-less-calibration{share:g}" if set_name == "val" and share else set_name

    def logits(self, source: str, set_name: str, split: AnySplit, draws: int | None = None) -> torch.Tensor:
        src = self.sources[source]
        n = draws or src.draws
        return self.cache.get(src.model_id, self.cache_name(set_name), n,
                              lambda: split_sampled_logits(src.model, split, n,
                                                           rows_per_forward=self.ev.rows_per_forward))  # [S, N, C]


def build_sources(evaluation: Evaluation) -> dict[str, Any]:
    """The models every method reads from; returns fitted settings (noise scale) for the record."""
    cfg, ev, run = evaluation.cfg, evaluation.ev, evaluation.run_dir
    draws_test = max([*ev.sweep_samples, ev.samples])
    opened = evaluation.opened
    family, raw_backbone = opened.family, opened.backbone  # the same three baseline modules serve every family
    classifier, contract = family.classifier, family.contract
    backbone = classifier(raw_backbone)
    backbone_id = fingerprint(run / BACKBONE_FILE)
    evaluation.add_source("deterministic", contract(DeterministicModel(backbone)), f"det-{backbone_id}", 1)
    evaluation.add_source("mc_dropout", contract(MCDropoutModel(backbone)), f"mcd-{backbone_id}", ev.samples)
    members = [classifier(m) for m in ensemble_members(cfg, ev.ensemble_members)]
    member_files = [Path(member_config(cfg, s).run_dir) / BACKBONE_FILE
                    for s in range(cfg.seed, cfg.seed + ev.ensemble_members)]
    evaluation.add_source("ensemble", contract(EnsembleModel(members)), f"ens-{fingerprint(*member_files)}",
                          len(members))
    if cfg.kep_svgp.in_evaluation:
        add_kep_svgp_source(evaluation)
    train = evaluation.inputs.train
    director, _ = opened.director()
    director = with_teacher(director, opened.view())  # as exported: its cost includes the kernel error's layer
    if cfg.export.feature_scores:  # as exported: the feature-space statistics of the training split beside it
        attach_feature_scores(director, train, int(train.labels.max()) + 1, cfg.seed, cfg.export.knn_bank)
    director_id = fingerprint(run / BACKBONE_FILE, run / DIRECTOR_FILE)
    evaluation.add_source("director", director, f"dir-{director_id}", ev.samples)
    for key, (_, make) in BACKBONE_PATHS.items():  # the backbone's own forward, without and with the kernel beside it
        module = backbone_path_builder(cfg, family, raw_backbone, train, int(train.labels.max()) + 1, make)(director,
                                                                                                         director)
        evaluation.add_source(key, module, f"{key}-{director_id}", 1)
    noisy = copy.deepcopy(director)

    def fit_scale() -> dict[str, Any]:
        scale, nll = fit_noise_scale(noisy, evaluation.inputs.val.head(cfg.export.threshold_images),
                                     ev.noise_scale_grid, ev.samples, cfg.seed)
        return {"scale": scale, "val_nll": nll}

    fit = cached_fit(evaluation.run_dir / "eval" / "noise_scale_fits.json", fit_scale,
                     f"{director_id}|{ev.noise_scale_grid}|S={ev.samples}|n={cfg.export.threshold_images}"
                     f"|seed={cfg.seed}{evaluation.cache_name('val').removeprefix('val')}")
    scale, nll_by_scale = fit["scale"], fit["val_nll"]
    noisy.rollout.noise_scale.fill_(scale)
    evaluation.add_source("director_noise", noisy, f"dir-{director_id}-noise{scale}", ev.samples)
    fitted = {"draws_test": draws_test, "noise_scale": scale, "noise_scale_val_nll": nll_by_scale}
    if ev.noise_correlation_grid:
        fitted["shift_noise"] = add_shift_noise_source(evaluation, director, director_id)
    if ev.served_version is not None:
        fitted["served"] = add_served_source(evaluation, director, director_id, ev.served_version)
    return fitted


def add_served_source(evaluation: Evaluation, director: torch.nn.Module, director_id: str, version: int
                      ) -> dict[str, Any]:
    """The run's DIRECTOR sampled as an exported version serves it: that manifest's token correlation, noise
    temperature, default S and served temperature (``model_repository/<export.name>/<version>``), so that the shift
    and its targets read what a request without ``n_samples`` gets, not a refit."""
    cfg = evaluation.cfg
    folder = Path(cfg.export.repository) / cfg.export.name / str(version)
    if not (folder / MANIFEST).is_file():
        raise FileNotFoundError(f"evaluate.served_version: no manifest at {folder / MANIFEST}")
    manifest = parse_manifest(read_document(folder))
    sampling = manifest.sampling
    record = {"version": version, "method": manifest.method, "token_correlation": sampling.token_correlation or 0.0,
              "noise_scale": sampling.noise_scale if sampling.noise_scale is not None else 1.0,
              "default_samples": sampling.default_samples, "temperature": manifest.temperature}
    if manifest.temperature_by_score is not None:
        record["temperature_by_score"] = manifest.temperature_by_score.document()
    record["ood"] = served_ood_rule(manifest.ood, sampling.default_samples)
    evaluation.served = record
    if manifest.method in BACKBONE_PATHS:  # that source already is what it serves: only its temperature rule differs
        return record
    served = copy.deepcopy(director)
    served.rollout.set_token_correlation(record["token_correlation"])
    served.rollout.noise_scale.fill_(record["noise_scale"])
    evaluation.add_source("director_served", served, f"dir-{director_id}-rho{record['token_correlation']:g}"
                          f"-noise{record['noise_scale']:g}", record["default_samples"])
    return record


def served_ood_rule(ood: Ood, n_samples: int) -> dict[str, Any]:
    """The OOD rule a version serves at its default S, as its manifest holds it: the score (with the combination's
    terms), the threshold and the name the export gave its choice. The evaluation scores the version's row with it
    rather than choosing again: the candidates' family AUROCs move by thousandths between two samplings, and where
    several sit within noise of each other a new choice would measure a score the server does not serve."""
    rule = ood.thresholds.get(n_samples) or ood.thresholds[min(ood.thresholds)]
    terms = [term.document() for term in ood.combination or []] if rule.score == COMBINED else []
    label = ood.selection_choice or (rule.score if not terms else
                                     combination_label(terms[0]["score"], terms[0]["weight"], terms[1]["score"]))
    return {"score": rule.score, "terms": terms, "threshold": rule.threshold, "label": label}


def cached_fit(path: Path, compute: Callable[[], dict[str, Any]], key: str) -> dict[str, Any]:
    """A fit's record under ``key`` in the JSON file ``path``, computed (and added to the file) only when absent: a fit
    samples the validation split once per grid point, so a rerun of the evaluation samples nothing."""
    fits = json.loads(path.read_text()) if path.exists() else {}
    if key not in fits:
        fits[key] = compute()
        path.write_text(json.dumps(fits, indent=2) + "\n")
    return fits[key]


def add_shift_noise_source(evaluation: Evaluation, director: torch.nn.Module, director_id: str) -> dict[str, Any]:
    """DIRECTOR with its noise shaped on a held-out shift: the token correlation and noise temperature chosen on
    validation inputs and their held-out shift (``training.data.held_out_shift``: rotated images, texts with
    typos), cached beside the noise-temperature fits."""
    cfg, ev = evaluation.cfg, evaluation.ev
    clean = evaluation.inputs.val.head(ev.noise_fit_images)
    shift = held_out_shift(cfg, clean)
    shaped = copy.deepcopy(director)

    def fit_shape() -> dict[str, Any]:
        rho, scale, grid = fit_noise_shape(shaped, clean, shift.split, ev.noise_correlation_grid,
                                           ev.shift_noise_scale_grid, ev.samples, cfg.seed)
        return {"token_correlation": rho, "noise_scale": scale, "grid": grid, "fitted_on": shift.description}

    fit = cached_fit(evaluation.run_dir / "eval" / "noise_shape_fits.json", fit_shape,
                     f"{director_id}|rho={ev.noise_correlation_grid}|scale={ev.shift_noise_scale_grid}"
                     f"|S={ev.samples}|n={len(clean)}|shift=True|seed={cfg.seed}|rule=within-noise"
                     f"{evaluation.cache_name('val').removeprefix('val')}")
    shaped.rollout.set_token_correlation(fit["token_correlation"])
    shaped.rollout.noise_scale.fill_(fit["noise_scale"])
    evaluation.add_source("director_shift_noise", shaped,
                          f"dir-{director_id}-rho{fit['token_correlation']:g}-noise{fit['noise_scale']:g}", ev.samples)
    return fit


def add_kep_svgp_source(evaluation: Evaluation) -> None:
    """The KEP-SVGP baseline (``training.baselines.kep_svgp``), fine-tuned first when the run has none; sampled with
    DIRECTOR's S."""
    cfg = evaluation.cfg
    model = build_baseline(cfg, "kep_svgp").module  # fine-tuned first when missing
    model_id = f"kep-{fingerprint(evaluation.run_dir / BACKBONE_FILE, kep_svgp_dir(cfg) / KEP_SVGP_FILE)}"
    evaluation.add_source("kep_svgp", model, model_id, evaluation.ev.samples)


def build_methods(evaluation: Evaluation) -> list[Method]:
    """The compared methods; temperatures are fitted on validation NLL of the method's own sampled logits."""
    ev, val = evaluation.ev, evaluation.inputs.val
    s, m = ev.samples, ev.ensemble_members
    det_t = fit_temperature(evaluation.logits("deterministic", "val", val), val.labels)
    dir_t = fit_temperature(evaluation.logits("director", "val", val), val.labels)
    return [
        Method("deterministic", "Deterministic (max softmax)", "deterministic", 1, family="deterministic"),
        Method("temperature_scaling", f"Temperature scaling (T={det_t:.2f})", "deterministic", 1, det_t,
               family="deterministic"),
        Method("mc_dropout", f"MC dropout (S={s})", "mc_dropout", s, family="mc_dropout"),
        Method("ensemble", f"Deep ensemble (M={m})", "ensemble", m, family="ensemble"),
        *([Method("kep_svgp", f"KEP-SVGP (S={s}, last {evaluation.cfg.kep_svgp.layers} layer(s))", "kep_svgp", s,
                  family="kep_svgp")] if "kep_svgp" in evaluation.sources else []),
        *(backbone_path_method(evaluation, key) for key in BACKBONE_PATHS),
        Method("director_s1", "DIRECTOR (S=1)", "director", 1),
        Method(f"director_s{s}", f"DIRECTOR (S={s})", "director", s),
        Method(f"director_s{s}_ts", f"DIRECTOR (S={s}) + TS (T={dir_t:.2f})", "director", s, dir_t),
        Method(f"director_s{s}_noise", f"DIRECTOR (S={s}) + noise temperature", "director_noise", s),
        *([Method(f"director_s{s}_shift_noise", f"DIRECTOR (S={s}) + shift-fitted noise", "director_shift_noise", s)]
          if "director_shift_noise" in evaluation.sources else []),
        *([served_method(evaluation.served)] if evaluation.served else []),
    ]


def temperature_shown(t: float, by_score: ScoreTemperature | None) -> str:
    return f"T={t:.2f}" if by_score is None else f"T={t:.2f} x exp({by_score.slope:g} * score)"


def served_method(served: dict[str, Any]) -> Method:
    """The row of ``add_served_source``: the version's default S and served temperature (per input when the version
    makes it grow with a score); a post-hoc or hybrid version's row reads that path's source."""
    s, t = served["default_samples"], served["temperature"]
    section = served.get("temperature_by_score")
    by_score = None if section is None else ScoreTemperature(
        t, section["slope"], tuple(ScoreTerm(x["score"], x["weight"], x["center"], x["scale"], x.get("log", False))
                                   for x in section["terms"]))
    shown = temperature_shown(t, by_score)
    method = served.get("method")
    if method in BACKBONE_PATHS:
        return Method(f"{method}_served", f"{BACKBONE_PATHS[method][0]} as served (v{served['version']}, {shown})",
                      method, 1, t, family=method, by_score=by_score)
    return Method("director_served", f"DIRECTOR as served (v{served['version']}, S={s}, rho "
                  f"{served['token_correlation']:g}, noise x{served['noise_scale']:g}, {shown})",
                  "director_served", s, t, by_score=by_score)


def backbone_path_method(evaluation: Evaluation, key: str) -> Method:
    """The post-hoc path or the hybrid (``key``) with its tools fitted as an export fits them
    (``training.posthoc.served_path``), on the same validation split, held-out shift and OOD-validation families: the
    temperature, kept only when it wins on held-out validation, then a temperature per input that follows its OOD score
    when ``export.temperature_slope_grid`` offers slopes. The post-hoc fit's record is kept in
    ``evaluation.posthoc_fit``."""
    cfg, val = evaluation.cfg, evaluation.inputs.val
    source = evaluation.sources[key]

    def fit() -> dict[str, Any]:
        path = fit_served_path(key, source.model, source.model, val, evaluation.inputs.ood_families, cfg, 1, [1],
                               held_out_shift(cfg, val), None)
        rule = path.by_score.temperature if path.by_score else None
        return {"temperature": path.temperature, "temperature_fit": json_safe(path.temperature_fit),
                "ood_score": path.stats.choice.label,
                "by_score": None if rule is None else {"base": rule.base, "slope": rule.slope,
                                                       "terms": [asdict(t) for t in rule.terms]}}

    # the fit passes the backbone over validation, its shift and every family several times: kept beside the other
    # fits, under everything it reads (the source, the export's settings, the seed, the validation carve)
    settings = hashlib.sha256(json.dumps(asdict(cfg.export), sort_keys=True, default=str).encode()).hexdigest()[:16]
    record = cached_fit(evaluation.run_dir / "eval" / f"{key}_fits.json", fit,
                        f"{source.model_id}|export={settings}|seed={cfg.seed}|{evaluation.cache_name('val')}")
    if key == POSTHOC:
        evaluation.posthoc_fit = {k: record[k] for k in ("temperature", "temperature_fit", "ood_score")}
    section = record["by_score"]
    by_score = None if section is None else ScoreTemperature(
        section["base"], section["slope"], tuple(ScoreTerm(**term) for term in section["terms"]))
    label = BACKBONE_PATHS[key][0]
    return Method(key, f"{label} ({temperature_shown(record['temperature'], by_score)})", key, 1,
                  record["temperature"], family=key, by_score=by_score)
