"""attn_helpers: the small, tested helper package behind the course "Attention, step by step".

Three tiers; imports run only downward (import-linter contracts in ``pyproject.toml``):

* the core, torch only: ``attention``, ``masks``, ``entropy``, ``positional``, ``multihead``,
  ``efficient``, ``kv_cache``, ``ring``, ``transformer``, ``decoder_lm`` (and ``_checks``,
  every argument check). Its public names
  import from here: ``import attn_helpers as ah; ah.scaled_dot_product_attention(q, k, v)``;
* shared machinery: ``training`` (the loop, checkpoints), ``measure``, ``plots``,
  ``notebook`` (``setup``) and ``course_map``;
* one stem per notebook: ``lessons.<slug>``, ``widgets.<slug>``, ``exercises.<slug>``, where
  ``<slug>`` is the notebook's name without its number (``05_masking.ipynb`` -> ``masking``);
  and ``pretrained`` (notebook 09).

The tools ``python -m attn_helpers bench|thumbnails|progress`` are imported by nothing. Importing
this package loads the core and ``setup`` only: no training stack, widgets or seaborn.
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

__all__ = [
    "check_claims",
    "sanity_checks",
    "parameter_count",
    "generate_without_cache",
    "generate_with_cache",
    "kv_cache_bytes",
    "FeedForward",
    "DecoderLayer",
    "TinyCausalLM",
    "AdditiveScore",
    "KVCache",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
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
