"""attn_helpers: the small, tested helper package behind the course "Attention, step by step".

The names most notebooks need are importable from here directly; each lives in a module with
one concept (``attention``, ``masks``, ``entropy``, ``multihead``, ``positional``, ``efficient``,
``seq2seq``, ``plots``, ``widgets``, ``exercises``, ...). README.md lists them all.
"""

from .attention import (
    AdditiveScore,
    additive_scores,
    dot_product_scores,
    masked_softmax,
    scaled_dot_product_attention,
    scaled_dot_product_scores,
)
from .efficient import linear_attention, local_attention, online_softmax_step, tiled_attention
from .entropy import attention_entropy, effective_keys, max_entropy, max_weight, normalized_entropy
from .kv_cache import KVCache, decode_with_cache
from .masks import causal_mask, key_padding_to_attention_mask, padding_mask, sliding_window_mask
from .multihead import MultiHeadAttention, merge_heads, split_heads
from .notebook import setup
from .positional import (
    LearnedPositionalEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    sinusoidal_encoding,
)
from .seq2seq import CrossAttention, Seq2Seq

__all__ = [
    "AdditiveScore",
    "CrossAttention",
    "KVCache",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "Seq2Seq",
    "additive_scores",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "attention_entropy",
    "causal_mask",
    "decode_with_cache",
    "dot_product_scores",
    "effective_keys",
    "key_padding_to_attention_mask",
    "linear_attention",
    "local_attention",
    "masked_softmax",
    "max_entropy",
    "max_weight",
    "merge_heads",
    "normalized_entropy",
    "online_softmax_step",
    "padding_mask",
    "scaled_dot_product_attention",
    "scaled_dot_product_scores",
    "setup",
    "sinusoidal_encoding",
    "sliding_window_mask",
    "split_heads",
    "tiled_attention",
]
__version__ = "0.1.0"
