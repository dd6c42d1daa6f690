"""Notebook 04's statements about ``nn.MultiheadAttention``'s mask conventions, as named booleans
(re-exported by :mod:`.multi_head`)."""

from __future__ import annotations

import torch

__all__ = ["mask_claims"]


def mask_claims(
    ours: tuple, reference: tuple, not_inverted: torch.Tensor, padding_dropped: torch.Tensor,
    causal: torch.Tensor, real: torch.Tensor,
) -> dict[str, bool]:
    """Notebook 04's statements about ``nn.MultiheadAttention``'s mask conventions.

    ``ours`` and ``reference``: ``(output (b, n, d), weights (b, h, n, n))`` of our module and
    of PyTorch's with both masks inverted; ``not_inverted``: PyTorch's output with our causal
    mask passed as ``attn_mask`` as it is; ``padding_dropped``: with the inverted ``attn_mask``
    but no ``key_padding_mask``; all batch first. ``causal`` ``(n, n)``, ``real`` ``(b, n)``
    (True = real token).
    """
    (out, weights), (ref_out, ref_weights) = ours, reference
    allowed = causal & real[:, None, :]                                # (b, n, n)
    flipped_empty = ~((~causal) & real[:, None, :]).any(-1)            # (b, n): no key left
    nan_rows = not_inverted.isnan().any(-1)
    differs = (not_inverted - out).abs().amax(-1) > 1e-4
    changed = (padding_dropped - out).abs().amax(-1) > 1e-6
    return {
        "with both masks inverted, nn.MultiheadAttention equals ours (outputs, every head's weights)":
            torch.allclose(out, ref_out, atol=1e-6) and torch.allclose(weights, ref_weights, atol=1e-6),
        "no weight lands on a padded or future key":
            bool((weights.masked_select(~allowed[:, None]) == 0).all()),
        "attn_mask not inverted: NaN in exactly the rows the flipped mask leaves without a key":
            bool(flipped_empty.any()) and torch.equal(nan_rows, flipped_empty),
        "attn_mask not inverted: every other row differs from ours":
            bool(differs[~flipped_empty].all()),
        "key_padding_mask dropped: real positions unchanged (they never see a pad), padded ones differ":
            not changed[real].any() and bool(changed[~real].all()),
    }
