"""A served model version as Triton's JSON model configuration (``GET /v2/models/{m}[/versions/{v}]/config``), so
that Triton's clients (tritonclient's ``get_model_config``, perf_analyzer, Model Analyzer) can read what the
server does: its inputs and outputs with their types and dims, its dynamic batching and queue, the device it runs
on, and DIRECTOR's sampling and OOD settings under ``parameters`` (every value a string, as Triton's are).
docs/api.md ("Triton and KServe") lists what each field means here."""

from __future__ import annotations

import json
from typing import Any

from service.api import oip_decisions
from service.api.oip import OUTPUT_TYPES
from service.config import Settings
from service.engine.artifact import Artifact, ood_rule
from service.engine.device import Device
from service.engine.modalities.base import TensorSpec
from service.engine.repository import ReadyVersion

TRITON_TYPES = {"FP32": "TYPE_FP32", "BOOL": "TYPE_BOOL", "BYTES": "TYPE_STRING", "INT64": "TYPE_INT64"}


def _tensor(spec: TensorSpec) -> dict[str, Any]:
    """One per-input tensor without its batch dimension; one element is dims [1] reshaped to [], as Triton writes a
    scalar."""
    config: dict[str, Any] = {"name": spec.name, "data_type": TRITON_TYPES[spec.datatype]}
    if spec.layout is not None:
        config["format"] = spec.layout
    config["dims"] = list(spec.dims)
    if spec.dims == (1,):
        config["reshape"] = {"shape": []}
    return config


def io_config(artifact: Artifact) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Inputs and outputs without their batch dimension (``max_batch_size`` > 0): the decoder's input tensor, the
    prediction's outputs, the decoder's per-input extras, a multi-label model's per-label outputs and, with a
    conformal part, the decision outputs (produced only when asked: ``parameters`` says so)."""
    decoder = artifact.decoder
    outputs = [{"name": "probabilities", "data_type": TRITON_TYPES[OUTPUT_TYPES["probabilities"]],
                "dims": [len(artifact.labels)], "label_filename": ""}]
    outputs += [_tensor(TensorSpec(name, kind, (1,))) for name, kind in OUTPUT_TYPES.items() if name != "probabilities"]
    outputs += [_tensor(spec) for spec in decoder.extra_outputs]
    width = (len(artifact.labels),)
    outputs += [_tensor(TensorSpec(name, kind, width)) for name, kind in artifact.task.label_outputs.items()]
    outputs += [_tensor(TensorSpec(name, oip_decisions.OUTPUT_TYPES[name], (1,)))
                for name in oip_decisions.declared(artifact)]
    return [_tensor(decoder.tensor)], outputs


def parameters(entry: ReadyVersion) -> dict[str, dict[str, str]]:
    """DIRECTOR's settings that have no Triton field: sampling, the OOD rule, the batch budgets, and which outputs
    exist only when the request asks for them."""
    artifact, serving = entry.artifact, entry.serving
    manifest = artifact.manifest
    values: dict[str, Any] = {
        "method": manifest.method,
        "modality": manifest.modality,
        "n_samples_default": entry.default_samples,
        "n_samples_max": entry.max_samples,
        "temperature": manifest.temperature,
        **({"temperature_slope": manifest.temperature_by_score.slope} if manifest.temperature_by_score else {}),
        "ood_score": ood_rule(manifest.ood, entry.default_samples).score,  # at the default sample count
        "ood_thresholds": json.dumps({str(k): v.threshold for k, v in sorted(manifest.ood.thresholds.items())}),
        "labels": json.dumps(artifact.labels),
        **({"kernel_verdict": manifest.kernel_verdict.sentence} if manifest.kernel_verdict else {}),
        **({"task": manifest.task, "label_thresholds": json.dumps(manifest.multi_label.thresholds)}
           if manifest.multi_label is not None else {}),  # a multi-label version: a sigmoid per label
    }
    cost = artifact.runner.batch_cost(serving.max_batch_samples, serving.max_batch_tokens)
    values[cost.setting] = cost.budget
    values |= artifact.decoder.parameters()
    values |= oip_decisions.config_parameters(artifact)
    return {key: {"string_value": str(value)} for key, value in values.items()}


def model_config(entry: ReadyVersion, settings: Settings, device: Device) -> dict[str, Any]:
    """The version as Triton's model configuration, with its model's own settings (config.yaml) where it has them."""
    serving = entry.serving
    inputs, outputs = io_config(entry.artifact)
    cuda = device.torch_device.type == "cuda"
    instance = {"name": f"{entry.name}_0", "kind": "KIND_GPU" if cuda else "KIND_CPU", "count": serving.instances}
    if cuda:
        instance["gpus"] = [device.torch_device.index or 0]
    return {
        "name": entry.name,
        "platform": "pytorch_libtorch",
        "backend": "pytorch",
        # the model's config.yaml, else every version (requests name one, or get the highest ready one)
        "version_policy": serving.version_policy,
        # inputs per request; a request's cost is also bounded in samples (DIRECTOR_MAX_REQUEST_BATCHES)
        "max_batch_size": settings.max_inputs_per_request,
        "input": inputs,
        "output": outputs,
        "batch_input": [],
        "batch_output": [],
        "dynamic_batching": {
            "preferred_batch_size": [],
            "max_queue_delay_microseconds": int(serving.max_batch_delay_ms * 1000),
            "preserve_ordering": False,
            "priority_levels": 0,
            "default_queue_policy": {"timeout_action": "REJECT",
                                     "default_timeout_microseconds": int(serving.request_timeout_s * 1e6),
                                     "allow_timeout_override": False, "max_queue_size": serving.max_queue},
        },
        "instance_group": [instance],
        "default_model_filename": "director.ts",
        "parameters": parameters(entry),
        "model_warmup": [],
    }
