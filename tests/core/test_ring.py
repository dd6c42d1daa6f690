"""Ring attention: real processes (gloo on 127.0.0.1) with R = 1 to 4, against full attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attn_helpers.ring import ring_attention, ring_schedule


def test_schedule_visits_every_block_once_per_rank():
    for world in (1, 2, 3, 5):
        schedule = ring_schedule(world)
        assert schedule[0] == list(range(world))  # each rank starts with its own block
        for rank in range(world):
            assert sorted(step[rank] for step in schedule) == list(range(world))
        for step in range(1, world):  # what rank r holds now, rank r - 1 held one step before
            assert all(schedule[step][r] == schedule[step - 1][(r - 1) % world] for r in range(world))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_processes_pass_blocks_around_a_ring(gen, world, causal):
    """Rank r holds block (r - s) mod R at step s (with R > 2 a ring differs from a swap)."""
    q, k, v = (torch.randn(2, 3, 41, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    out, stats = ring_attention(q, k, v, world, causal=causal, timeout_s=60, return_stats=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    schedule = ring_schedule(world)
    for rank in range(world):
        assert stats[rank]["block"] == [step[rank] for step in schedule]
        # causal: a rank scores exactly the blocks at or before its own
        assert stats[rank]["computed"] == [not causal or step[rank] <= rank for step in schedule]

