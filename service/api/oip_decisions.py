"""Prediction sets and abstentions over the Open Inference Protocol (HTTP and gRPC) and the batch scorer: the asks
of ``/predict`` (``coverage``, ``conformal_score``, ``class_conditional``, ``max_risk``, ``abstain_if_ood``) read from
loose parameters with ``/predict``'s types and ranges, and the answers as OIP outputs (docs/api.md, "Prediction sets
and abstentions"). The decisions themselves are ``service.engine.decisions``'s, run by the shared prediction use case.

Outputs, present only when their ask is: ``prediction_set`` BYTES ``[N]``, each element the set's labels as a JSON
array string (``["Shirt", "T-shirt/top"]``, most probable first; ``[]`` for an empty set), since a tensor holds one
value per input and a set has any number of labels; ``set_size`` INT64 ``[N]``; ``abstain`` BOOL ``[N]``;
``exchangeable`` BOOL ``[N]`` with either ask (``service.engine.shift``). A version
declares those its decisions can produce in its model metadata and Triton configuration (all three with a conformal
part, the first two for a multi-label version's label sets), each marked as produced only when its ask is given; one
without decisions declares none."""

from __future__ import annotations

import json
import math
from typing import Any

from service.engine.artifact import Artifact
from service.engine.decisions import DecisionRequest, Decisions
from service.errors import bad_input, invalid

SCORES = ("lac", "aps", "raps")
ASKS = ("coverage", "conformal_score", "class_conditional", "max_risk", "abstain_if_ood",
        "widen_if_shifted")  # the parameters read
EITHER = "coverage or max_risk"
OUTPUT_TYPES = {"prediction_set": "BYTES", "set_size": "INT64", "abstain": "BOOL", "exchangeable": "BOOL"}
NEEDS = {"prediction_set": "coverage", "set_size": "coverage", "abstain": "max_risk",
         "exchangeable": EITHER}  # output -> its ask
CONTENTS = {"prediction_set": "the set's labels, most probable first, as a JSON array string ([] for an empty set)",
            "set_size": "the number of labels in prediction_set",
            "abstain": "true when the input should go to a person",
            "exchangeable": "false when the input, its request or the live traffic looks shifted from the "
                            "calibration data, so the set's or abstention's guarantee may not hold"}
Loc = list[str | int]
SHOWN_DIGITS = 20  # of an integer quoted in an error


def decision_request(parameters: dict[str, Any], loc: Loc | None = None) -> DecisionRequest:
    """The request's asks, each checked as ``/predict`` checks its field (422 naming the parameter); what asks
    nothing gives an empty request, which the prediction use case leaves alone."""
    where: Loc = loc or ["body", "parameters"]
    score = parameters.get("conformal_score")
    if score is not None and score not in SCORES:
        raise invalid(f"parameter conformal_score must be one of {', '.join(SCORES)}, got {str(score)[:40]!r}",
                      [*where, "conformal_score"])
    return DecisionRequest(coverage=_fraction(parameters, "coverage", where),
                           max_risk=_fraction(parameters, "max_risk", where), score=score,
                           class_conditional=_flag(parameters, "class_conditional", False, where),
                           abstain_if_ood=_flag(parameters, "abstain_if_ood", True, where),
                           widen_if_shifted=_flag(parameters, "widen_if_shifted", True, where))


def _fraction(parameters: dict[str, Any], name: str, loc: Loc) -> float | None:
    """A number strictly between 0 and 1 (``coverage``, ``max_risk``), or None when absent."""
    value = parameters.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(f"parameter {name} must be a number, got {type(value).__name__}", [*loc, name])
    # no integer lies between 0 and 1, and one of hundreds of digits is past any float (math.isfinite overflows)
    if isinstance(value, int) or not (math.isfinite(value) and 0 < value < 1):
        raise invalid(f"parameter {name} must be between 0 and 1 (both excluded), got {_number(value)}", [*loc, name])
    return value


def _number(value: int | float) -> str:
    """A number as an error quotes it: an integer of hundreds of digits is not echoed back."""
    if isinstance(value, int) and abs(value) >= 10**SHOWN_DIGITS:
        return f"an integer of {value.bit_length()} bits"
    return str(value)


def _flag(parameters: dict[str, Any], name: str, default: bool, loc: Loc) -> bool:
    value = parameters.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"parameter {name} must be true or false, got {type(value).__name__}", [*loc, name])
    return value


def answered_outputs(ask: DecisionRequest | None) -> list[str]:
    """The decision outputs a request's asks give (every output of the response unless it names some)."""
    if ask is None:
        return []
    asked = {"coverage": ask.coverage is not None, "max_risk": ask.max_risk is not None}
    asked[EITHER] = asked["coverage"] or asked["max_risk"]
    return [name for name, need in NEEDS.items() if asked[need]]


def answerable(names: list[str], ask: DecisionRequest | None) -> list[str]:
    """The named outputs the request answers: a decision output named without its ask is left out (nothing fills
    it), so that a client naming every output the metadata declares, as perf_analyzer and Model Analyzer do, is
    answered; 400 when that leaves nothing to answer (a client that named only such outputs forgot the ask)."""
    given = answered_outputs(ask)
    kept = [name for name in names if name not in NEEDS or name in given]
    if names and not kept:
        name = names[0]
        raise bad_input(f"output {name!r} needs the parameter {NEEDS[name]}: give {NEEDS[name]} with the request, "
                        "or do not ask for this output")
    return kept


def left_out_parameters(body: dict[str, Any], requested: list[str] | None) -> dict[str, str]:
    """The response parameter that says which named decision outputs ``answerable`` left out and the ask each needs
    (none when nothing was), so that nothing a client named disappears without a word. ``body``'s outputs are
    already checked by ``requested_outputs``."""
    named = [item["name"] for item in body.get("outputs") or []]
    dropped = [name for name in named if name in NEEDS and name not in (requested or [])]
    if not named or not dropped:
        return {}
    return {"outputs_left_out": ", ".join(f"{name} (needs {NEEDS[name]})" for name in dropped)}


def output_values(decisions: Decisions | None, labels: list[str]) -> dict[str, tuple[str, list[int], list[Any]]]:
    """Each decision output the request answered: (datatype, shape, data)."""
    if decisions is None:
        return {}
    values: dict[str, tuple[str, list[int], list[Any]]] = {}
    if decisions.sets is not None:
        sets = decisions.sets
        encoded = [json.dumps([labels[c] for c in s], ensure_ascii=False) for s in sets]  # one string per input
        values["prediction_set"] = ("BYTES", [len(sets)], encoded)
        values["set_size"] = ("INT64", [len(sets)], [len(s) for s in sets])
    if decisions.abstain is not None:
        values["abstain"] = ("BOOL", [len(decisions.abstain)], list(decisions.abstain))
    if decisions.exchangeable is not None:
        values["exchangeable"] = ("BOOL", [len(decisions.exchangeable)], list(decisions.exchangeable))
    return values


def response_parameters(decisions: Decisions | None) -> dict[str, Any]:
    """The rules applied, for the response ``parameters`` (scalars, as OIP parameters are)."""
    return {} if decisions is None else decisions.rules()


def declared(artifact: Artifact) -> list[str]:
    """The decision outputs a version declares in its metadata and configuration: those its decisions can produce
    (all three with a conformal part, the sets' two for a multi-label version's label sets), none without."""
    return [] if artifact.decisions is None else [name for name in OUTPUT_TYPES if name in artifact.decisions.outputs]


def metadata_outputs(artifact: Artifact) -> list[dict[str, Any]]:
    """The decision outputs as OIP metadata tensors (``[-1]``, one value per input), each with the parameters that
    say when it is produced: ``requires`` names the request parameter (gRPC's ``TensorMetadata`` has no parameters:
    there the configuration's ``decision_outputs`` says it)."""
    return [{"name": name, "datatype": OUTPUT_TYPES[name], "shape": [-1],
             "parameters": {"requires": NEEDS[name],
                            "description": f"{CONTENTS[name]}; produced only when the request's parameters give "
                                           f"{NEEDS[name]}"}}
            for name in declared(artifact)]


def config_parameters(artifact: Artifact) -> dict[str, str]:
    """What the Triton configuration's parameters say of the decision outputs (none without a conformal part)."""
    outputs = declared(artifact)
    if not outputs:
        return {}
    return {"decision_outputs": json.dumps({name: NEEDS[name] for name in outputs}),
            "decision_outputs_note": f"{', '.join(outputs)} are produced only when the request's parameters ask for "
                                     "them: prediction_set and set_size with coverage, abstain with max_risk "
                                     "(decision_outputs: output -> parameter); named in outputs without it, an output "
                                     "is left out of the response"}
