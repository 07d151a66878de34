"""Request and response schemas of the JSON API (``/predict``, ``/feedback``, ``/models``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, model_validator

from service.engine.decisions import DecisionRequest
from service.engine.modalities.base import Base64Image, Loc, PixelValues, RawInput, Text
from service.engine.texts import surrogate_message

SEED_MAX = 2**63 - 1
NAME_MAX = 256  # characters of a model or version name in a request
LABELS_MAX = 10_000  # the most true labels one multi-label feedback may list
INDEX_MAX = 2**63 - 1  # the largest integer SQLite stores (the feedback store's input index column)


def _unicode(text: str) -> str:
    message = surrogate_message(text)
    if message is not None:
        raise ValueError(f"string {message}")
    return text


UnicodeStr = Annotated[str, AfterValidator(_unicode)]


class ImageRequestInput(BaseModel):
    """An encoded PNG or JPEG image, converted to the model's channels and size (see docs/api.md)."""

    model_config = ConfigDict(extra="forbid")
    image_base64: str = Field(..., description="base64 (standard alphabet) of a PNG or JPEG file")

    def raw(self, loc: Loc) -> RawInput:
        return Base64Image(self.image_base64, [*loc, "image_base64"])


class PixelsRequestInput(BaseModel):
    """Pixels already in the model's layout: ``[H, W]`` (1-channel models) or ``[C, H, W]``, floats in [0, 1]."""

    model_config = ConfigDict(extra="forbid")
    pixels: list[Any] = Field(..., description="nested list [C][H][W] (or [H][W]) of floats in [0, 1]")

    def raw(self, loc: Loc) -> RawInput:
        return PixelValues(self.pixels, [*loc, "pixels"])


class TextRequestInput(BaseModel):
    """A text string, for text models (sent to an image model it is refused with 422). Tokenised with the model's
    own tokenizer and truncated to the manifest's ``input.max_length`` tokens; the prediction reports ``tokens``,
    ``truncated`` and ``dropped_tokens``."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(..., description="raw text, not empty; longer than the model's character limit (min of the "
                                       "manifest's input.max_characters and DIRECTOR_MAX_TEXT_CHARS) -> 413")

    def raw(self, loc: Loc) -> RawInput:
        return Text(self.text, [*loc, "text"])


RequestInput = ImageRequestInput | PixelsRequestInput | TextRequestInput


def raw_inputs(inputs: list[RequestInput]) -> list[RawInput]:
    """A request's JSON inputs as the models' decoders take them, each with where it was in the request."""
    return [item.raw(["body", "inputs", i]) for i, item in enumerate(inputs)]


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    model: UnicodeStr | None = Field(None, max_length=NAME_MAX, description="model name; the server's default model "
                                                                            "when omitted")
    version: UnicodeStr | None = Field(None, max_length=NAME_MAX, description="model version; the highest ready "
                                                                              "version when omitted")
    inputs: list[RequestInput] = Field(..., min_length=1, description="one or more inputs, answered in order")
    # strict: true, "8" and 4.0 are not sample counts or seeds (a client sending them has a bug worth hearing about)
    n_samples: int | None = Field(None, ge=1, strict=True, description="stochastic samples per input (a JSON "
                                  "integer), 1..manifest max_samples; the manifest's default_samples when omitted")
    seed: int | None = Field(None, ge=0, le=SEED_MAX, strict=True, description="run alone under "
                             "torch.manual_seed(seed) (a JSON integer): the same request gives the same answer")
    return_probabilities: bool = Field(True, strict=True, description="include the label -> probability map per "
                                                                      "input")
    # strict too: "0.9" is no coverage (as OIP's parameters and n_samples refuse it); a JSON integer is a number
    coverage: float | None = Field(None, gt=0, lt=1, allow_inf_nan=False, strict=True, description=(
        "return each input's prediction_set: the labels a split-conformal rule keeps so that the true label is in "
        "the set with at least this probability, marginally over exchangeable inputs (the version's range, usually "
        "[0.5, 0.999]; 400 for a version exported without a conformal calibration). A multi-label version returns "
        "the labels whose probability reaches a threshold chosen so that the set holds on average at least this "
        "share of an input's true labels (conformal risk control)"))
    conformal_score: Literal["lac", "aps", "raps"] | None = Field(None, description=(
        "the nonconformity score of the sets (lac: 1 - p; aps: the mass ranked at or above the label; raps: aps with "
        "a rank penalty); the version's default when omitted"))
    class_conditional: bool = Field(False, strict=True, description="sets with the coverage within each true class "
                                                                   "(Mondrian), not only on average")
    max_risk: float | None = Field(None, gt=0, lt=1, allow_inf_nan=False, strict=True, description=(
        "return each input's abstain flag: answered only when its confidence reaches the threshold chosen on the "
        "calibration split so that the error rate among answered inputs is at most max_risk with probability "
        "1 - delta (Learn then Test)"))
    abstain_if_ood: bool = Field(True, strict=True, description="with max_risk: an input that does not look "
                                 "exchangeable with the calibration data (flagged OOD, or in a request or live "
                                 "traffic that looks shifted) abstains whatever its confidence")
    widen_if_shifted: bool = Field(True, strict=True, description="with coverage: when the request's inputs as a "
                                   "whole look shifted (decisions.shift says why), every set holds every label: no "
                                   "narrower set keeps its promise there")

    def decision_request(self) -> DecisionRequest:
        return DecisionRequest(self.coverage, self.max_risk, self.conformal_score, self.class_conditional,
                               self.abstain_if_ood, self.widen_if_shifted)


class Prediction(BaseModel):
    index: int = Field(..., description="position of the input in the request")
    label: str = Field(..., description="predicted label: argmax of the mean probability over samples (multi-label: "
                                        "the most probable label; `labels` lists those predicted)")
    class_index: int = Field(..., description="index of the label in the manifest's labels")
    confidence: float = Field(..., description="max of the mean probability over samples (multi-label: the mean "
                                               "over labels of max(p, 1 - p))")
    probabilities: dict[str, float] | None = Field(None, description="label -> mean probability over samples "
                                                                     "(multi-label: a sigmoid each, not summing to 1)")
    predictive_entropy: float = Field(..., description="entropy of the mean probability, nats (multi-label: the sum "
                                                       "of the labels' Bernoulli entropies)")
    expected_entropy: float = Field(..., description="mean over samples of each sample's entropy, nats")
    mutual_information: float = Field(..., description="predictive - expected entropy (>= 0; 0 at n_samples=1), "
                                                       "nats")
    labels: list[str] | None = Field(None, description="multi-label models: the labels predicted (probability at or "
                                                       "above the label's threshold), in the manifest's order")
    label_entropy: dict[str, float] | None = Field(None, description="multi-label models: label -> Bernoulli "
                                                                     "entropy of its mean probability, nats")
    label_mutual_information: dict[str, float] | None = Field(None, description="multi-label models: label -> its "
                                                              "entropy less the mean of each sample's (>= 0), nats")
    ood_score: float = Field(..., description="the manifest's OOD score for this sample count; higher = more OOD")
    is_ood: bool = Field(..., description="ood_score > the threshold passing 95% of in-distribution validation "
                                          "inputs")
    tokens: int | None = Field(None, description="text models: tokens the model read, [CLS]/[SEP] included (at most "
                                                 "the manifest's input.max_length)")
    truncated: bool | None = Field(None, description="text models: true when the text had more tokens than "
                                                     "input.max_length and was truncated as the manifest says")
    dropped_tokens: int | None = Field(None, description="text models: tokens cut off by truncation (0 if none)")
    prediction_set: list[str] | None = Field(None, description="with coverage: the labels kept, most probable first "
                                                               "(may be empty or every label)")
    set_size: int | None = Field(None, description="with coverage: the number of labels in prediction_set")
    abstain: bool | None = Field(None, description="with max_risk: true when the input should go to a person "
                                                   "(confidence under the threshold, or not exchangeable)")
    exchangeable: bool | None = Field(None, description="with coverage or max_risk: false when the input (its OOD "
                                      "flag), its request or the live traffic looks shifted from the calibration "
                                      "data: the set's and the abstention's guarantees assume it is true")


class OodInfo(BaseModel):
    score: str = Field(..., description="name of the OOD score (max_softmax, predictive_entropy, "
                                        "mutual_information, energy)")
    threshold: float = Field(..., description="is_ood = ood_score > threshold")
    calibrated_n_samples: int = Field(..., description="sample count the threshold was calibrated at")
    note: str | None = Field(None, description="set when n_samples has no calibrated threshold of its own")


class DecisionInfo(BaseModel):
    coverage: float | None = Field(None, description="the coverage the sets were built for")
    conformal_score: str | None = Field(None, description="the nonconformity score of the sets")
    class_conditional: bool | None = Field(None, description="sets with the coverage within each class")
    max_risk: float | None = Field(None, description="the requested bound on the error rate of answered inputs")
    risk_level: float | None = Field(None, description="the calibrated risk level used: the largest at or below "
                                                       "max_risk (its guarantee is at least as strict)")
    confidence_threshold: float | None = Field(None, description="answered when confidence >= this (null: no "
                                                                 "threshold meets the risk; every input abstains)")
    delta: float | None = Field(None, description="the guarantee's failure probability over calibration splits")
    abstain_if_ood: bool | None = Field(None, description="inputs that are not exchangeable abstain")
    widen_if_shifted: bool | None = Field(None, description="sets hold every label when the request looks shifted")
    shift: str | None = Field(None, description="why the request's inputs as a whole look shifted from the "
                              "calibration data (their OOD flags, or the live drift): no guarantee holds for them")
    reason: str | None = Field(None, description="why every input abstains, when that is the answer")


class Timings(BaseModel):
    queue_ms: float = Field(..., description="wait in the model's queue")
    inference_ms: float = Field(..., description="forward + summaries of the batch this request ran in (a request "
                                                 "over one batch runs in parts: the sum of its parts' batches)")
    total_ms: float = Field(..., description="server time from request to response")
    batch_requests: int = Field(..., description="requests that shared the forward (run in parts: the largest part's)")
    batch_rows: int = Field(..., description="sampled rows in the forward (inputs x n_samples, summed; run in parts: "
                                             "the largest part's)")
    batch_padded_length: int | None = Field(None, description="text models: the width the batch's token ids were "
                                                              "right-padded to (its longest text rounded up to a "
                                                              "multiple of 8)")


class PredictResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    id: str = Field(..., description="request id; quote it in /feedback")
    model: str = Field(..., description="model that answered")
    model_version: str = Field(..., description="version that answered")
    n_samples: int = Field(..., description="stochastic samples per input that were run")
    ood: OodInfo = Field(..., description="the OOD rule applied to every input at this sample count")
    predictions: list[Prediction] = Field(..., description="one per input, in request order")
    decisions: DecisionInfo | None = Field(None, description="with coverage or max_risk: the rules applied")
    timings: Timings = Field(..., description="where the server's time went")


TrueLabels = Annotated[list[UnicodeStr | StrictInt], Field(max_length=LABELS_MAX)]  # a multi-label model's


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: UnicodeStr | None = Field(None, min_length=1, max_length=64, description="the id of a /predict response "
                                                                              "(or request_id instead)")
    request_id: UnicodeStr | None = Field(None, min_length=1, max_length=128, description=(
        "the X-Request-ID the prediction's request carried (or was given in its response): names the newest "
        "prediction made under it, instead of id"))
    index: int = Field(0, ge=0, le=INDEX_MAX, strict=True, description="input index in that request")
    label: UnicodeStr | StrictInt | TrueLabels = Field(..., description=(
        "true label: a label name or a class index (a JSON integer); for a multi-label model the list of its true "
        "labels (names or indices, [] for none)"))

    @model_validator(mode="after")
    def _no_bool(self) -> FeedbackRequest:
        if isinstance(self.label, bool) or (isinstance(self.label, list)
                                            and any(isinstance(v, bool) for v in self.label)):
            raise ValueError("label must be a label name or a class index")
        if (self.id is None) == (self.request_id is None):
            raise ValueError("give the prediction's id or its request_id (one of them)")
        return self


class FeedbackResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    id: str = Field(..., description="request id the label was joined to")
    index: int = Field(..., description="input index in that request")
    model: str = Field(..., description="model that made the prediction")
    model_version: str = Field(..., description="version that made the prediction")
    correct: bool = Field(..., description="the logged prediction equals the reported label")
    live_accuracy: float | None = Field(..., description="accuracy over the latest labelled predictions of the "
                                                         "version (DIRECTOR_FEEDBACK_WINDOW)")
    live_ece: float | None = Field(..., description="expected calibration error (15 equal-width bins, as the "
                                                    "manifest's reference) over the same window")
    labelled: int = Field(..., description="labelled predictions behind the live figures")


class VersionInfo(BaseModel):
    version: str = Field(..., description="version folder name")
    state: str = Field(..., description="ready | loading | unavailable")
    reason: str | None = Field(None, description="why the version is unavailable")
    reload_error: str | None = Field(None, description="set while a ready version's changed folder failed to load: "
                                                        "why; the version keeps serving the files it loaded before")
    method: str | None = Field(None, description="the manifest's method: director, hybrid (the backbone's "
                                                  "own labels with the DIRECTOR kernel's error beside them as "
                                                  "uncertainty signal), posthoc (the backbone with DIRECTOR's "
                                                  "post-hoc tools, no kernel), deterministic, mc_dropout, ensemble "
                                                  "or kep_svgp")
    modality: str | None = Field(None, description="image or text")
    default_samples: int | None = Field(None, description="n_samples when a request gives none (the model's "
                                                          "config.yaml, else the manifest)")
    max_samples: int | None = Field(None, description="largest n_samples accepted (config.yaml, else the manifest)")
    loaded_at: float | None = Field(None, description="unix time the version became ready")
    queue_depth: int | None = Field(None, description="requests waiting for a batch")
    input: dict[str, Any] | None = Field(None, description="the manifest's input section (image: channels, height, "
                                                           "width; text: tokenizer, max_length, max_characters, "
                                                           "truncation, padding)")
    max_text_characters: int | None = Field(None, description="text models: the longest text accepted, min of "
                                                              "input.max_characters and DIRECTOR_MAX_TEXT_CHARS")
    samples_informative: bool | None = Field(None, description="whether n_samples > 1 changes anything measurable "
                                                              "on this version, from what its export measured (null: "
                                                              "not measured, or the version is not loaded)")
    samples_note: str | None = Field(None, description="the evidence behind samples_informative, in words")
    kernel_verdict: str | None = Field(None, description="what the DIRECTOR kernel adds on this model, measured at "
                                                         "export against the backbone with the same post-hoc tools, "
                                                         "and which of the two this version serves (null: exported "
                                                         "before the verdict, or not loaded)")
    serving: dict[str, Any] | None = Field(None, description="what a ready version is served with: the server's "
                                                             "settings with the model's config.yaml over them")


class ModelSummary(BaseModel):
    name: str = Field(..., description="model folder name")
    default_version: str | None = Field(None, description="highest ready version")
    versions: list[VersionInfo] = Field(..., description="every version in the repository, lowest first")
    config: dict[str, Any] | None = Field(None, description="what the model's config.yaml sets (null: no file)")
    config_error: str | None = Field(None, description="why the model's config.yaml was refused (its versions are "
                                                       "then unavailable)")


class ModelList(BaseModel):
    default_model: str = Field(..., description="model used when a request names none")
    models: list[ModelSummary] = Field(..., description="every model in the repository")


class ModelDetail(ModelSummary):
    manifest: dict[str, Any] | None = Field(None, description="manifest of the default (or requested) version")
    reference: dict[str, Any] | None = Field(None, description="reference calibration: validation accuracy, ECE, "
                                                              "NLL and confidence/entropy quantiles")


class Health(BaseModel):
    status: str = Field(..., description="alive (/health/live), ready or not_ready")
    draining: bool = Field(False, description="shutting down: finishing queued requests, accepting none")
    models: dict[str, dict[str, str]] = Field(default_factory=dict, description="model -> version -> state")
    missing_required: list[str] = Field(default_factory=list, description="DIRECTOR_REQUIRED_MODELS that are "
                                                                           "not ready")
    saturated: list[str] = Field(default_factory=list, description="the default model or DIRECTOR_REQUIRED_MODELS "
                                                                    "whose queue is full (predictions refused)")
