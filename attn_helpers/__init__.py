"""attn_helpers: the tested helper package behind "Attention, step by step".

Tiers, imports only downward: the core (torch only; its public names import from here), shared
machinery (``training``, ``measure``, ``plots``, ``notebook``, ``course_map``), then per notebook
``lessons.<slug>``, ``widgets.<slug>``, ``exercises.<slug>`` and ``pretrained``. Importing it is light.
"""

from .attention import (
    AdditiveScore,
    additive_scores,
    dot_product_scores,
    masked_softmax,
    scaled_dot_product_attention,
    scaled_dot_product_scores,
)
from .decoder_lm import TinyCausalLM
from .efficient import linear_attention, local_attention, online_softmax_step, tiled_attention
from .entropy import attention_entropy, effective_keys, max_entropy, max_weight, normalized_entropy
from .kv_cache import (
    KVCache,
    decode_with_cache,
    generate_with_cache,
    generate_without_cache,
    kv_cache_bytes,
)
from .masks import causal_mask, key_padding_to_attention_mask, padding_mask, sliding_window_mask
from .multihead import MultiHeadAttention, merge_heads, parameter_count, split_heads
from .notebook import check_claims, sanity_checks, setup
from .positional import (
    LearnedPositionalEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    sinusoidal_encoding,
)
from .transformer import DecoderLayer, FeedForward

__all__ = ["check_claims", "sanity_checks", "parameter_count", "generate_without_cache",
           "generate_with_cache", "kv_cache_bytes", "FeedForward", "DecoderLayer", "TinyCausalLM",
           "AdditiveScore", "KVCache", "LearnedPositionalEmbedding", "MultiHeadAttention",
           "additive_scores", "alibi_bias", "alibi_slopes", "apply_rope", "attention_entropy",
           "causal_mask", "decode_with_cache", "dot_product_scores", "effective_keys",
           "key_padding_to_attention_mask", "linear_attention", "local_attention", "masked_softmax",
           "max_entropy", "max_weight", "merge_heads", "normalized_entropy", "online_softmax_step",
           "padding_mask", "scaled_dot_product_attention", "scaled_dot_product_scores", "setup",
           "sinusoidal_encoding", "sliding_window_mask", "split_heads", "tiled_attention"]
__version__ = "0.1.0"
