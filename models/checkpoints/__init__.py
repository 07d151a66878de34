"""Users' pretrained classifiers converted exactly into the canonical backbones everything downstream understands:
a timm ``VisionTransformer`` inside ``ImageClassifier`` (view: ``VitTransitionView``) and a transformers ``BertModel``
inside ``TextClassifier`` (view: ``BertTransitionView``).

Every converter returns ``(backbone, labels)``: the backbone in eval mode with the source's weights copied (no shared
storage), and the class names in index order where the source carries them (a Hugging Face ``config.id2label``,
timm's ``pretrained_cfg["label_names"]``), else None. What cannot be represented exactly is refused with a
ValueError that says what is supported, never approximated.

A converted backbone is saved as a JSON-able spec plus its state dict and rebuilt with random weights of the same
layout by ``vit_from_spec`` / ``text_classifier_from_spec``, then ``load_state_dict``.

Modules: ``common`` (label order, linear copies, the GELU check), ``vit`` (Hugging Face and timm ViTs, their spec)
and ``bert`` (Hugging Face BERT-family encoders and classifiers, their spec).
"""

from models.checkpoints.bert import (
    ENCODERS,
    SEQUENCE_CLASSIFIERS,
    TEXT_SPEC_FORMAT,
    bert_family_from_hf,
    text_classifier_from_spec,
    text_classifier_spec,
)
from models.checkpoints.vit import (
    LAYER_SCALE_INIT,
    VIT_SPEC_FORMAT,
    processor_normalisation,
    vit_from_hf,
    vit_from_spec,
    vit_from_timm,
    vit_spec,
)

__all__ = ["ENCODERS", "LAYER_SCALE_INIT", "SEQUENCE_CLASSIFIERS", "TEXT_SPEC_FORMAT", "VIT_SPEC_FORMAT",
           "bert_family_from_hf", "processor_normalisation", "text_classifier_from_spec", "text_classifier_spec",
           "vit_from_hf", "vit_from_spec", "vit_from_timm", "vit_spec"]
