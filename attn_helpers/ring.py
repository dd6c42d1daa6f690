"""Ring attention (Liu et al., 2023): rank ``r`` of ``R`` keeps query block ``r`` while the key/value
blocks travel the ring (block ``(r - s) mod R`` at step ``s``), each folded into its online-softmax
state as the next one arrives. :func:`ring_attention` runs ``R`` processes (gloo on 127.0.0.1).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ._checks import check_qkv, require_bool, require_number, require_positive_int, resolve_scale, shape
from .efficient import OnlineSoftmaxState, block_state, finalize, init_state, merge_states, tile_scores

__all__ = ["ring_schedule", "split_blocks", "ring_attention"]


def ring_schedule(world_size: int) -> list[list[int]]:
    """``schedule[step][rank] = (rank - step) mod world_size``: the block ``rank`` holds at ``step``."""
    require_positive_int("world_size", world_size)
    return [[(rank - step) % world_size for rank in range(world_size)] for step in range(world_size)]


def split_blocks(n: int, world_size: int) -> list[tuple[int, int]]:
    """Contiguous ``(start, end)`` of the ``world_size`` blocks (sizes differ by at most 1)."""
    require_positive_int("n", n)
    require_positive_int("world_size", world_size)
    if world_size > n:
        raise ValueError(f"world_size={world_size} is larger than the sequence length n={n}")
    bounds = [round(i * n / world_size) for i in range(world_size + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _partial(q_block, k_block, v_block, q_range, kv_range, *, causal: bool, scale: float
             ) -> OnlineSoftmaxState | None:
    """The state of a query block against one key/value block; ``None`` if the causal mask hides it."""
    if causal and kv_range[0] >= q_range[1]:
        return None
    scores = tile_scores(q_block, k_block, slice(*q_range), slice(*kv_range), scale=scale,
                         causal=causal)                               # (..., n/R, n/R)
    return block_state(scores, v_block)


def _prepare(q, k, v, world_size, causal):
    check_qkv(q, k, v)
    require_bool("causal", causal)
    if not q.shape[-2] == k.shape[-2]:
        raise ValueError(f"ring attention splits one sequence: q and k need the same n, "
                         f"got q {shape(q)} and k {shape(k)}")
    if q.shape[:-2] != k.shape[:-2] or q.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"q, k and v need the same batch dimensions, got q {shape(q)}, "
                         f"k {shape(k)}, v {shape(v)}")
    return split_blocks(q.shape[-2], world_size), resolve_scale(None, q.shape[-1])


def _loopback_interface() -> str | None:
    """``lo`` on Linux, ``lo0`` on macOS."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((name for name in names if name in ("lo", "lo0")), None)


def _exchange(send: list[torch.Tensor], receive: list[torch.Tensor], rank: int, world_size: int):
    """Start sending ``send`` to rank + 1 and receiving ``receive`` from rank - 1 -> requests."""
    return ([dist.isend(t, (rank + 1) % world_size) for t in send]
            + [dist.irecv(t, (rank - 1) % world_size) for t in receive])


def _empty_block(k_block, v_block, rows: int) -> list[torch.Tensor]:
    return [t.new_empty((*t.shape[:-2], rows, t.shape[-1])) for t in (k_block, v_block)]


def _worker(rank: int, world_size: int, store_file: str, blocks, shards, causal: bool, scale: float,
            timeout_s: float, out: torch.Tensor, record: torch.Tensor) -> None:
    """One rank, in its own process: writes its output block into ``out`` and ``(held block,
    computed)`` per step into ``record[rank]`` (shared memory)."""
    torch.set_num_threads(1)
    interface = _loopback_interface()
    if interface is not None:  # gloo binds to this interface only: loopback traffic only
        os.environ["GLOO_SOCKET_IFNAME"] = interface
    # the ranks meet through a file: a TCP port chosen in advance can be taken before the bind
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout_s))
    try:
        q_block, k_held, v_held = (t.contiguous() for t in shards[rank])
        held = rank                                                   # index of the held block
        rows = [end - start for start, end in blocks]                 # positions per block
        state = init_state(q_block.shape[:-2], q_block.shape[-2], v_held.shape[-1],
                           dtype=q_block.dtype)
        for step in range(world_size):
            requests, source = [], (rank - step - 1) % world_size
            if step < world_size - 1:  # pass the held block on and receive the next, in background
                incoming = _empty_block(k_held, v_held, rows[source])
                requests = _exchange([k_held, v_held], incoming, rank, world_size)
            part = _partial(q_block, k_held, v_held, blocks[rank], blocks[held], causal=causal,
                            scale=scale)
            state = state if part is None else merge_states(state, part)   # meanwhile, the transfer
            for request in requests:
                request.wait()
            record[rank, step] = torch.tensor([held, part is not None])
            if requests:
                k_held, v_held, held = incoming[0], incoming[1], source
        out[..., blocks[rank][0]:blocks[rank][1], :] = finalize(state)
    finally:
        dist.destroy_process_group()


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int = 2, *,
                   causal: bool = False, timeout_s: float = 120.0, return_stats: bool = False):
    """Exact attention by ``world_size`` processes passing key/value blocks in a ring (within
    ``timeout_s``, else ``TimeoutError``). q, k ``(..., n, d_k)``, v ``(..., n, d_v)`` on CPU ->
    ``(..., n, d_v)``, and with ``return_stats`` ``{rank: {"block", "computed"}}``: per step, the
    key/value block held and whether it was scored. On one machine the blocks travel over loopback:
    memory copies, not a network, so this module does not time them."""
    blocks, scale = _prepare(q, k, v, world_size, causal)
    if q.device.type != "cpu":
        raise ValueError(f"ring_attention runs on CPU tensors (gloo), got device {q.device}")
    timeout_s = require_number("timeout_s", timeout_s, positive=True)
    require_bool("return_stats", return_stats)
    start_method = "fork" if sys.platform.startswith("linux") else "spawn"   # fork: no re-import
    shards = [tuple(t[..., s:e, :].clone() for t in (q, k, v)) for s, e in blocks]
    out = q.new_empty((*q.shape[:-1], v.shape[-1])).share_memory_()  # (..., n, d_v)
    record = torch.zeros(world_size, world_size, 2, dtype=torch.long).share_memory_()
    store_dir = tempfile.mkdtemp(prefix="ring_attention_")  # the ranks' rendezvous file lives here
    args = (world_size, os.path.join(store_dir, "store"), blocks, shards, causal, scale, timeout_s,
            out, record)
    deadline, context = time.monotonic() + timeout_s, None
    try:
        context = mp.start_processes(_worker, args=args, nprocs=world_size, join=False,
                                     daemon=True, start_method=start_method)
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"ring attention did not finish within timeout_s={timeout_s}")
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
        raise RuntimeError(f"rank {error.error_index} of the ring failed:\n{error}") from error
    finally:
        for process in context.processes if context is not None else []:
            if process.is_alive():
                process.terminate()
                process.join(timeout=5.0)
        shutil.rmtree(store_dir, ignore_errors=True)
    stats = {rank: {"block": record[rank, :, 0].tolist(), "computed": record[rank, :, 1].bool().tolist()}
             for rank in range(world_size)}
    return (out, stats) if return_stats else out
