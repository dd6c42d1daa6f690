"""Ring attention: 2 real processes (gloo on 127.0.0.1) and the single-process schedule."""

from __future__ import annotations

import pytest
import torch

import attn_helpers as ah
from attn_helpers.ring import free_port, ring_attention, ring_schedule, simulate_ring, split_blocks


def test_schedule_visits_every_block_once_per_rank():
    for world in (1, 2, 3, 5):
        schedule = ring_schedule(world)
        assert schedule[0] == list(range(world))  # each rank starts with its own block
        for rank in range(world):
            assert sorted(step[rank] for step in schedule) == list(range(world))
        for step in range(1, world):  # what rank r holds now, rank r - 1 held one step before
            assert all(schedule[step][r] == schedule[step - 1][(r - 1) % world] for r in range(world))


def test_split_blocks_cover_the_sequence():
    assert split_blocks(10, 3) == [(0, 3), (3, 7), (7, 10)]
    assert split_blocks(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ValueError, match="world_size"):
        split_blocks(3, 4)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_simulated_ring_equals_full_attention(gen, world, causal):
    q, k, v = (torch.randn(2, 3, 23, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = ah.causal_mask(23) if causal else None
    torch.testing.assert_close(simulate_ring(q, k, v, world, causal=causal),
                               ah.scaled_dot_product_attention(q, k, v, mask)[0])


@pytest.mark.parametrize("causal", [False, True])
def test_two_processes_equal_full_attention(gen, causal):
    q, k, v = (torch.randn(1, 4, 37, 16, generator=gen) for _ in range(3))
    out, log = ring_attention(q, k, v, 2, causal=causal, timeout_s=60, return_log=True)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    assert sorted(log) == [0, 1]
    assert [block for _, block, _ in log[0]] == [0, 1] and [b for _, b, _ in log[1]] == [1, 0]
    # with a causal mask, rank 0 (the first half) never needs the second half's keys
    assert log[0][1][2] is (not causal)


def test_free_port_is_a_loopback_port():
    port = free_port()
    assert 1024 <= port < 65536


def test_bad_inputs(gen):
    q = torch.randn(5, 4, generator=gen)
    with pytest.raises(ValueError, match="same n"):
        ring_attention(q, q[:3], q[:3])
    with pytest.raises(ValueError, match="world_size"):
        ring_attention(q, q, q, 6)
    with pytest.raises(ValueError, match="timeout_s"):
        ring_attention(q, q, q, 2, timeout_s=0)
    with pytest.raises(ValueError, match="start_method"):
        ring_attention(q, q, q, 2, start_method="thread")
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        simulate_ring(q, "k", q)
