"""The decoder artifact: DIRECTOR on a Qwen2 / Llama classifier as plain, scriptable modules (docs/method.md;
the contract: docs/architecture.md).

The artifact is the text one (``models.text_director.TextDirector``, exported by its ``fold_for_artifact``) on the
decoder's own parts (``models.decoder_layers``): the token table, the deterministic prefix (the first T - K
transitions, once per input), ``StochasticRollout`` over the last K steps with a causal kernel
(``TransitionKernel(..., causal=True)``) and the readout (last MLP sublayer, final RMSNorm, last real token, score
head). Inputs are right-padded (a text's tokens start at position 0). Padding changes nothing for the real tokens:
attention is causal and masks padding keys, and the readout reads the last real token.
"""

from __future__ import annotations

import copy

from torch import nn

from models.decoder_layers import DecoderEmbedding
from models.decoder_view import DecoderTransitionView
from models.director import StochasticRollout
from models.kernel import TransitionKernel
from models.text_director import TextBackbone, TextDirector


def decoder_director_from_view(view: DecoderTransitionView, kernel: TransitionKernel,
                               readout: nn.Module | None = None, table_dtype: str = "float32") -> TextDirector:
    """DIRECTOR on the frozen view's own embedding, prefix (the first T - K transitions, K = the kernel's steps) and
    readout (a ``DecoderReadout``), copied into plain modules (a float32 table reproduces the decoder's X_0 exactly).
    ``kernel`` must be causal: a bidirectional one would let a token see the tokens after it, which its teacher
    never does."""
    if not kernel.causal:
        raise ValueError("a decoder's kernel attends causally, like its teacher: TransitionKernel(causal=True)")
    embedding = DecoderEmbedding(view.embedding.word_table.float(), table_dtype)
    prefix = view.prefix(view.num_steps - kernel.num_steps)
    return TextDirector(embedding, StochasticRollout(kernel), copy.deepcopy(readout or view.readout_head), prefix)


def decoder_backbone_from_view(view: DecoderTransitionView, table_dtype: str = "float32",
                               layer_dtype: str = "float32") -> TextBackbone:
    """The plain fine-tuned decoder under the artifact contract (the deterministic baseline): its embedding, all T
    transitions as the prefix and its readout, copied."""
    embedding = DecoderEmbedding(view.embedding.word_table.float(), table_dtype)
    return TextBackbone.frozen(embedding, view.prefix(view.num_steps), copy.deepcopy(view.readout_head), layer_dtype)
