"""Ring attention: real processes (gloo on 127.0.0.1) with P = 2, 3, 4, and the single-process
schedule, against full attention."""

from __future__ import annotations

import tempfile
import time

import pytest
import torch
import torch.nn.functional as F

import attn_helpers as ah
import attn_helpers.ring as ring
from attn_helpers.ring import ring_attention, ring_schedule, simulate_ring, split_blocks


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
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    assert sorted(log) == [0, 1]
    assert [block for _, block, _ in log[0]] == [0, 1] and [b for _, b, _ in log[1]] == [1, 0]
    # with a causal mask, rank 0 (the first half) never needs the second half's keys
    assert log[0][1][2] is (not causal)


@pytest.mark.parametrize("world", [3, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_three_and_four_processes_pass_blocks_around_a_ring(gen, world, causal):
    """With P > 2 a ring differs from a swap: rank r holds block (r - s) mod P at step s."""
    q, k, v = (torch.randn(2, 3, 41, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    out, log = ring_attention(q, k, v, world, causal=causal, timeout_s=60, return_log=True)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, expected)
    schedule = ring_schedule(world)
    for rank in range(world):
        assert [block for _, block, _ in log[rank]] == [step[rank] for step in schedule]
        # causal: a rank scores exactly the blocks at or before its own
        assert [computed for _, block, computed in log[rank]] == [
            not causal or step[rank] <= rank for step in schedule]


def test_stats_report_compute_and_transfer_time_per_block(gen):
    world, n, d = 3, 30, 8
    q, k, v = (torch.randn(1, 2, n, d, generator=gen) for _ in range(3))
    out, stats = ring_attention(q, k, v, world, causal=True, timeout_s=60, return_stats=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert sorted(stats) == list(range(world))
    for s in stats.values():
        assert set(s) == {"compute_s", "wait_s", "transfer_s", "block_bytes"}
        assert len(s["compute_s"]) == len(s["wait_s"]) == world
        assert all(t >= 0 for t in s["compute_s"] + s["wait_s"]) and s["transfer_s"] > 0
        assert s["block_bytes"] == 2 * 2 * (n // world) * d * 4  # keys and values, float32
        # (which blocks a rank scores and which it skips: the log, checked above; the times
        # themselves are measurements, never asserted in a unit test)
    # one process: nothing travels
    out, stats = ring_attention(q, k, v, 1, timeout_s=60, return_stats=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert stats[0]["transfer_s"] == 0 and len(stats[0]["compute_s"]) == 1


def test_a_failing_rank_is_reported_and_the_ring_stopped(gen, monkeypatch):
    def broken(*args, **kwargs):
        raise ArithmeticError("rank broke on purpose")

    monkeypatch.setattr(ring, "_partial", broken)  # forked workers inherit the patched module
    q = torch.randn(8, 4, generator=gen)
    with pytest.raises(RuntimeError, match="rank broke on purpose"):
        ring_attention(q, q, q, 2, timeout_s=30, start_method="fork")


def test_a_hung_ring_times_out(gen, monkeypatch, tmp_path):
    """A rank that hangs is stopped: the ring raises without waiting for it to finish (no time
    is measured; a rank that got to finish would leave its marker file)."""
    finished = tmp_path / "a rank finished"

    def hang(*args, **kwargs):
        time.sleep(60)
        finished.write_text("the ring waited for the hung rank")

    monkeypatch.setattr(ring, "_partial", hang)
    q = torch.randn(8, 4, generator=gen)
    with pytest.raises(TimeoutError, match="timeout_s=2"):
        ring_attention(q, q, q, 2, timeout_s=2, start_method="fork")
    assert not finished.exists()


@pytest.mark.slow
def test_spawned_processes_equal_full_attention(gen):
    q, k, v = (torch.randn(1, 2, 19, 8, generator=gen) for _ in range(3))
    out = ring_attention(q, k, v, 3, causal=True, timeout_s=120, start_method="spawn")
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("fail", [False, True])
def test_ranks_meet_through_a_file_that_is_removed_afterwards(gen, monkeypatch, tmp_path, fail):
    """No TCP port is chosen in advance (another program could take it before the ranks bind it:
    EADDRINUSE, seen in CI); the rendezvous file is gone afterwards, also when a rank fails."""
    scratch, log = tmp_path / "tmp", tmp_path / "init_methods"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    init = ring.dist.init_process_group

    def logged(*args, init_method, **kwargs):
        with open(log, "a") as f:
            f.write(init_method + "\n")
        if fail:
            raise ConnectionError("rendezvous broke on purpose")
        return init(*args, init_method=init_method, **kwargs)

    monkeypatch.setattr(ring.dist, "init_process_group", logged)  # forked ranks inherit it
    q = torch.randn(8, 4, generator=gen)
    if fail:
        with pytest.raises(RuntimeError, match="rendezvous broke on purpose"):
            ring_attention(q, q, q, 2, timeout_s=30, start_method="fork")
    else:
        torch.testing.assert_close(ring_attention(q, q, q, 2, timeout_s=30, start_method="fork"),
                                   F.scaled_dot_product_attention(q, q, q))
    methods = log.read_text().split()
    assert len(methods) >= 1 and all(m.startswith(f"file://{scratch}/") for m in methods)
    assert len(set(methods)) == 1  # all ranks meet at one file
    # (torch's own start_processes leaves its pytorch-errorfile-*.pickle when a rank fails)
    assert [p for p in scratch.iterdir() if not p.name.startswith("pytorch-errorfile-")] == []
    assert ring.LOOPBACK == "127.0.0.1"


def test_bad_inputs(gen):
    q = torch.randn(5, 4, generator=gen)
    with pytest.raises(ValueError, match="same n"):
        ring_attention(q, q[:3], q[:3])
    with pytest.raises(ValueError, match="world_size"):
        ring_attention(q, q, q, 6)
    with pytest.raises(ValueError, match="timeout_s"):
        ring_attention(q, q, q, 2, timeout_s=0)
    with pytest.raises(TypeError, match="return_stats"):
        ring_attention(q, q, q, 2, return_stats="yes")
    with pytest.raises(ValueError, match="start_method"):
        ring_attention(q, q, q, 2, start_method="thread")
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        simulate_ring(q, "k", q)
    with pytest.raises(TypeError, match="causal"):
        simulate_ring(q, q, q, causal=1)


# --- bad input at each entry point (issue 17's fuzz findings) ----------------------------------


def test_huge_world_size_is_refused_up_front():
    with pytest.raises(ValueError, match=r"world_size=1000000000 is more ranks.*\(1024\).*1e\+18"):
        ring_schedule(10**9)                                                # was a hang
    with pytest.raises(ValueError, match=r"world_size=1000000000 is more ranks"):
        split_blocks(10**9, 10**9)
    assert len(split_blocks(ring.MAX_WORLD_SIZE, ring.MAX_WORLD_SIZE)) == ring.MAX_WORLD_SIZE
    with pytest.raises(ValueError, match="world_size=1025"):
        split_blocks(2000, ring.MAX_WORLD_SIZE + 1)


def test_ring_checks_q_k_v_with_the_shared_check():
    with pytest.raises(ValueError, match=r"k and v must hold at least one key.*\(2, 0, 4\)"):
        simulate_ring(*(torch.zeros(2, 0, 4) for _ in range(3)))            # was named n
    with pytest.raises(TypeError, match="v must have the same dtype as q"):
        simulate_ring(torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 2).double())
    with pytest.raises(ValueError, match="q and k must have d_k >= 1"):
        simulate_ring(torch.zeros(4, 0), torch.zeros(4, 0), torch.zeros(4, 2))
