"""Ring attention (Liu et al., 2023): rank ``r`` of ``R`` keeps query block ``r`` while the key/value
blocks travel the ring (block ``(r - s) mod R`` at step ``s``), each folded into its online-softmax
state as the next one arrives. :func:`ring_attention` runs ``R`` processes (gloo on 127.0.0.1).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ._checks import check_qkv, require_bool, require_number, require_positive_int, resolve_scale, shape
from .efficient import block_state, finalize, init_state, merge_states, tile_scores

__all__ = ["ring_schedule", "ring_attention"]


def ring_schedule(world_size: int) -> list[list[int]]:
    """``schedule[step][rank] = (rank - step) mod world_size``: the block ``rank`` holds at ``step``."""
    require_positive_int("world_size", world_size)
    return [[(rank - step) % world_size for rank in range(world_size)] for step in range(world_size)]


def _worker(rank: int, world_size: int, store_file: str, blocks, shards, causal: bool, scale: float,
            timeout_s: float, out: torch.Tensor, record: torch.Tensor) -> None:
    """One rank, in its own process: writes its output block into ``out`` and ``(held block,
    computed)`` per step into ``record[rank]`` (shared memory)."""
    torch.set_num_threads(1)
    if sys.platform != "win32":  # gloo binds to the loopback interface only: loopback traffic only
        os.environ["GLOO_SOCKET_IFNAME"] = "lo0" if sys.platform == "darwin" else "lo"
    # the ranks meet through a file: a TCP port chosen in advance can be taken before the bind
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout_s))
    try:
        q_block, k_held, v_held = (t.contiguous() for t in shards[rank])
        held, (start, stop) = rank, blocks[rank]                      # index of the held block
        state = init_state(q_block.shape[:-2], q_block.shape[-2], v_held.shape[-1],
                           dtype=q_block.dtype)
        for step in range(world_size):
            requests, source = [], (rank - step - 1) % world_size
            if step < world_size - 1:  # pass the held block on to rank + 1, take the next from rank - 1
                rows = blocks[source][1] - blocks[source][0]
                incoming = [t.new_empty((*t.shape[:-2], rows, t.shape[-1])) for t in (k_held, v_held)]
                requests = ([dist.isend(t, (rank + 1) % world_size) for t in (k_held, v_held)]
                            + [dist.irecv(t, (rank - 1) % world_size) for t in incoming])
            computed = not (causal and blocks[held][0] >= stop)      # causal: no key before a query
            if computed:                                              # meanwhile, the transfer
                scores = tile_scores(q_block, k_held, slice(start, stop), slice(*blocks[held]),
                                     scale=scale, causal=causal)          # (..., n/R, n/R)
                state = merge_states(state, block_state(scores, v_held))
            for request in requests:
                request.wait()
            record[rank, step] = torch.tensor([held, computed])
            if requests:
                k_held, v_held, held = incoming[0], incoming[1], source
        out[..., start:stop, :] = finalize(state)
    finally:
        dist.destroy_process_group()


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int = 2, *,
                   causal: bool = False, timeout_s: float = 120.0, return_stats: bool = False):
    """Exact attention by ``world_size`` processes passing key/value blocks in a ring (within
    ``timeout_s``, else ``TimeoutError``). q, k ``(..., n, d_k)``, v ``(..., n, d_v)`` on CPU ->
    ``(..., n, d_v)``, and with ``return_stats`` ``{rank: {"block", "computed"}}``: per step, the
    key/value block held and whether it was scored. On one machine the blocks travel over loopback:
    memory copies, not a network, so this module does not time them."""
    check_qkv(q, k, v)
    require_bool("causal", causal)
    if q.shape[-2] != k.shape[-2] or not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(f"ring attention splits one sequence: q, k and v need the same n and batch "
                         f"dimensions, got q {shape(q)}, k {shape(k)}, v {shape(v)}")
    require_positive_int("world_size", world_size)
    if world_size > q.shape[-2]:
        raise ValueError(f"world_size={world_size} is larger than the sequence length n={q.shape[-2]}")
    bounds = [round(i * q.shape[-2] / world_size) for i in range(world_size + 1)]
    blocks, scale = list(zip(bounds[:-1], bounds[1:], strict=True)), resolve_scale(None, q.shape[-1])
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
