"""KEP-SVGP attention in a post-LN BERT-family text classifier (``models.kep_svgp``; docs/method.md, "Baselines:
KEP-SVGP"): the last ``layers`` encoder layers get KEP-SVGP attention over each text's real tokens (the key padding
mask), the rest of the encoder stays as it is and runs once per input.

A replaced layer keeps BERT's post-LN shape: ``a = LN_1(x + W_O f(x))`` with f the sampled GP attention (queries, keys
and W_O start from the layer's own), then the layer's own feed-forward sublayer ``h = LN_2(a + FFN(a))``. The
encoder's first T - L layers are its plain-module copies (``models.text_layers``: transitions 1..T-L, then layer
T-L's feed-forward sublayer), and the classifier's pooling over real tokens and head read the last layer's output.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers.models.bert.modeling_bert import BertLayer

from models.bert_view import BertEmbedding
from models.kep_svgp import KepSvgpAttention
from models.text_backbones import TextClassifier, pool_tokens
from models.text_layers import TextFeedForward, TextPrefix


def kep_svgp_from_bert(layer: BertLayer, num_tokens: int, rank: int, rank_multi: int) -> KepSvgpAttention:
    """A KEP-SVGP attention whose queries, keys and output projection start from a BERT layer's."""
    attn, output = layer.attention.self, layer.attention.output
    dim = attn.query.in_features
    module = KepSvgpAttention(dim, attn.num_attention_heads, num_tokens, rank, rank_multi,
                              qk_bias=attn.query.bias is not None)
    with torch.no_grad():
        module.qk.weight.copy_(torch.cat([attn.query.weight, attn.key.weight]))
        if attn.query.bias is not None:
            module.qk.bias.copy_(torch.cat([attn.query.bias, attn.key.bias]))
        module.proj.load_state_dict(output.dense.state_dict())
    return module


class KepSvgpTextLayer(nn.Module):
    """One post-LN encoder layer with KEP-SVGP attention: [R, L, D] and its key padding mask -> [R, L, D]."""

    def __init__(self, layer: BertLayer, num_tokens: int, rank: int, rank_multi: int) -> None:
        super().__init__()
        self.attn = kep_svgp_from_bert(layer, num_tokens, rank, rank_multi)
        self.norm = copy.deepcopy(layer.attention.output.LayerNorm)
        self.feed_forward = TextFeedForward.from_bert(layer)

    def forward_terms(self, x: torch.Tensor, key_padding_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, ksvd = self.attn.forward_terms(x, key_padding_mask)  # [R, L, D], []
        return self.feed_forward(self.norm(x + out)), ksvd  # [R, L, D]


class TextKepSvgpClassifier(nn.Module):
    """A text classifier whose last ``layers`` encoder layers have KEP-SVGP attention, behind the text artifact
    contract: ``forward(input_ids, attention_mask, n_samples) -> [S, B, C]`` and ``sample_rows(input_ids,
    attention_mask, repeats) -> [sum(repeats), C]``; the embedding and the first T - L layers run once per input,
    the replaced layers, pooling and head once per sample row."""

    def __init__(self, classifier: TextClassifier, layers: int = 1, rank: int = 10, rank_multi: int = 10,
                 num_tokens: int = 64) -> None:
        super().__init__()
        classifier = copy.deepcopy(classifier)
        encoder_layers = classifier.encoder.encoder.layer
        depth = len(encoder_layers)
        if not 1 <= layers <= depth:
            raise ValueError(f"KEP-SVGP replaces 1..{depth} layers, got {layers}")
        kept = depth - layers
        self.embedding = BertEmbedding(classifier.encoder)
        self.prefix = TextPrefix.from_bert(encoder_layers, kept)  # transitions 1..T-L: X_{T-L}
        self.prefix_feed_forward = (TextFeedForward.from_bert(encoder_layers[kept - 1]) if kept
                                    else nn.Identity())  # layer T-L's feed-forward sublayer: h_{T-L}
        self.blocks = nn.ModuleList(KepSvgpTextLayer(layer, num_tokens, rank, rank_multi)
                                    for layer in encoder_layers[kept:])
        self.replaced = list(range(kept, depth))  # 0-based indices of the replaced layers
        self.num_layers = depth
        self.pooling, self.dropout, self.head = classifier.pooling, classifier.dropout, classifier.head

    def frozen_parts(self) -> list[nn.Module]:
        """What fine-tuning leaves as it is unless told otherwise: the embedding and the layers before."""
        return [self.embedding, self.prefix, self.prefix_feed_forward]

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, L] ids and mask -> h_{T-L} [B, L, D], the input of the first replaced layer (deterministic)."""
        x = self.prefix(self.embedding(input_ids), attention_mask.bool())  # [B, L, D]
        return self.prefix_feed_forward(x)  # [B, L, D]

    def finish(self, x: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The replaced layers, pooling and head on rows [R, L, D] -> (logits [R, C], summed KSVD loss)."""
        mask = attention_mask.bool()  # [R, L]
        ksvd = torch.zeros((), device=x.device)
        for block in self.blocks:
            x, loss = block.forward_terms(x, mask)  # [R, L, D], []
            ksvd = ksvd + loss
        return self.head(self.dropout(pool_tokens(x, mask, self.pooling))), ksvd  # [R, C]

    def forward_terms(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """One sampled logit row per input (training): (logits [B, C], KSVD loss)."""
        return self.finish(self.start(input_ids, attention_mask), attention_mask)

    def kl(self) -> torch.Tensor:
        """The ELBO's KL term: both SVGPs' KL summed over the replaced layers."""
        return torch.stack([block.attn.kl() for block in self.blocks]).sum()

    def sample_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: torch.Tensor
                    ) -> torch.Tensor:
        x = self.start(input_ids, attention_mask)  # [B, L, D]
        total = int(repeats.sum())
        rows = torch.repeat_interleave(x, repeats, dim=0, output_size=total)  # [R, L, D]
        mask = torch.repeat_interleave(attention_mask, repeats, dim=0, output_size=total)  # [R, L]
        return self.finish(rows, mask)[0]  # [R, C]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_samples: int) -> torch.Tensor:
        batch = input_ids.shape[0]
        repeats = torch.full((batch,), n_samples, dtype=torch.long, device=input_ids.device)
        return self.sample_rows(input_ids, attention_mask, repeats).view(batch, n_samples, -1).transpose(0, 1)
