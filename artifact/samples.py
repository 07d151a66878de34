"""Whether drawing more than one sample changes anything on a model, read from what its manifest records (the
export's paired NLL tables), in words ``GET /models`` shows a client (docs/api.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from artifact.contract import Manifest


@dataclass(frozen=True)
class SamplesVerdict:
    """``informative`` is None when the export measured nothing to decide it."""

    informative: bool | None
    note: str


def samples_verdict(manifest: Manifest) -> SamplesVerdict:
    """A deterministic model's samples are one row repeated. A DIRECTOR model's default sample count is the smallest
    whose validation NLL (and, when the noise was shaped on a held-out shift, its NLL there) is within two standard
    errors of the largest count's (paired per input), so a default of 1 with that table says more samples bought
    nothing measurable; a score read from the samples' spread (``mutual_information``) makes them informative
    whatever the NLL says."""
    if manifest.method == "deterministic":
        return SamplesVerdict(False, "a deterministic model: every sample is the same row, so n_samples > 1 changes "
                                     "nothing and mutual_information is 0")
    if manifest.method == "posthoc":
        return SamplesVerdict(False, "the post-hoc path (the backbone's own forward with its post-hoc temperature and "
                                     "OOD score, no DIRECTOR kernel): every sample is the same row, so n_samples > 1 "
                                     "changes nothing and mutual_information is 0")
    if manifest.method == "hybrid":
        return SamplesVerdict(False, "the hybrid (the backbone's own forward for the labels, the DIRECTOR kernel "
                                     "beside it for its error, which the OOD score and the temperature read): nothing "
                                     "is "
                                     "sampled, every sample is the same row, so n_samples > 1 changes nothing and "
                                     "mutual_information is 0")
    scores = {manifest.ood.score, *(term.score for term in manifest.ood.combination or [])}
    if "mutual_information" in scores:
        return SamplesVerdict(True, "the OOD score reads the spread of the samples (mutual_information): use "
                                    "n_samples >= 2")
    table = manifest.provenance.default_samples_nll if manifest.provenance else None
    if not table or 1 not in table or len(table) < 2:
        return SamplesVerdict(None, "not measured at export")
    measured = measured_nll("validation", {str(k): v.model_dump() for k, v in table.items()})
    default = manifest.sampling.default_samples
    if default == 1:
        return SamplesVerdict(False, f"more samples change nothing measurable on this model: {measured}, so the "
                                     "default is S=1; the samples' disagreement (mutual_information) buys no accuracy "
                                     "or calibration here and is not its OOD score: use ood_score and is_ood (score "
                                     f"{manifest.ood.score})")
    extras = (manifest.provenance.model_extra or {}) if manifest.provenance else {}
    shifted = (extras.get("noise_shape_fit") or {}).get("default_samples_nll_shifted")
    if shifted and "1" in shifted:
        return SamplesVerdict(True, f"more samples lower the NLL on shifted inputs: on the held-out shift the noise "
                                    f"was shaped on, {measured_nll('', shifted)}; on {measured}; the default is "
                                    f"S={default}{spread_note(manifest)}")
    return SamplesVerdict(True, f"more samples lower the NLL on this model: {measured}; the default is "
                                f"S={default}{spread_note(manifest)}")


def spread_note(manifest: Manifest) -> str:
    """What ``mutual_information`` is worth as an OOD score next to the served one, on the export's OOD validation."""
    auroc = manifest.ood.selection_auroc or {}
    chosen = auroc.get(manifest.ood.selection_choice or manifest.ood.score)
    mine = auroc.get("mutual_information")
    if mine is None or chosen is None or mine >= chosen:
        return ""
    return (f"; mutual_information (how much the samples disagree) is a weaker OOD signal here: AUROC {mine:.3f} on "
            f"the OOD validation set against {chosen:.3f} for the served score, so flag with ood_score / is_ood")


def measured_nll(where: str, table: dict[str, dict[str, Any]]) -> str:
    """One NLL table's S = 1 row against its reference (the largest S), in words."""
    reference = max(table, key=int)
    single = table["1"]
    return (f"{where + ' ' if where else ''}NLL at S=1 was {single['nll']:.4f} against {table[reference]['nll']:.4f} "
            f"at S={reference} (paired difference {single['minus_reference']:+.4f}, standard error "
            f"{single['stderr']:.4f})")
