"""attn_helpers: the small, tested helper package behind the course "Attention, step by step".

The names most notebooks need are importable from here directly; each lives in a module with
one concept (``attention``, ``masks``, ``entropy``, ``plots``, ``widgets``, ``exercises``, ...).
"""

from .attention import (
    AdditiveScore,
    additive_scores,
    dot_product_scores,
    masked_softmax,
    scaled_dot_product_attention,
    scaled_dot_product_scores,
)
from .entropy import attention_entropy, effective_keys, max_entropy, max_weight, normalized_entropy
from .masks import causal_mask, key_padding_to_attention_mask, padding_mask, sliding_window_mask
from .notebook import setup

__all__ = [
    "AdditiveScore",
    "additive_scores",
    "attention_entropy",
    "causal_mask",
    "dot_product_scores",
    "effective_keys",
    "key_padding_to_attention_mask",
    "masked_softmax",
    "max_entropy",
    "max_weight",
    "normalized_entropy",
    "padding_mask",
    "scaled_dot_product_attention",
    "scaled_dot_product_scores",
    "setup",
    "sliding_window_mask",
]
__version__ = "0.1.0"
