"""Ring attention: exact attention over a sequence split across processes.

The sequence of ``n`` positions is cut into ``world_size`` contiguous blocks; rank ``r`` keeps the
queries of block ``r`` for the whole computation, and the key/value blocks travel around a ring
(rank ``r`` sends to ``r + 1`` and receives from ``r - 1``). After ``world_size`` steps every
rank has seen every key/value block once, folding each into its running online-softmax state
(:func:`attn_helpers.efficient.merge_states`); its output block is then exact. No rank ever holds
more than its own queries, one visiting key/value block and an ``(n / world_size)^2`` block of
scores, which is how very long contexts are spread over many GPUs.

:func:`ring_attention` really runs it: ``world_size`` processes started with
``torch.multiprocessing``, talking through ``torch.distributed`` with the ``gloo`` backend
on the loopback address ``127.0.0.1`` and a free port. :func:`simulate_ring` runs the same
schedule in one process (for tests and for reading).
"""

from __future__ import annotations

import math
import os
import queue
import socket
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ._checks import require_positive_int, shape
from .efficient import OnlineSoftmaxState, _check_qkv, block_state, finalize, init_state, merge_states

__all__ = ["ring_schedule", "split_blocks", "simulate_ring", "ring_attention", "free_port"]

LOOPBACK = "127.0.0.1"


def ring_schedule(world_size: int) -> list[list[int]]:
    """``schedule[step][rank]``: the key/value block rank ``rank`` holds at step ``step``.

    Each rank starts with its own block and, at every step, passes what it holds to the next rank,
    so at step ``s`` rank ``r`` holds block ``(r - s) mod world_size``.
    """
    require_positive_int("world_size", world_size)
    return [[(rank - step) % world_size for rank in range(world_size)] for step in range(world_size)]


def split_blocks(n: int, world_size: int) -> list[tuple[int, int]]:
    """Contiguous ``(start, end)`` position ranges of the ``world_size`` blocks (sizes differ by at
    most one)."""
    require_positive_int("n", n)
    require_positive_int("world_size", world_size)
    if world_size > n:
        raise ValueError(f"world_size={world_size} is larger than the sequence length n={n}")
    bounds = [round(i * n / world_size) for i in range(world_size + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _partial(q_block: torch.Tensor, k_block: torch.Tensor, v_block: torch.Tensor, *,
             q_range: tuple[int, int], kv_range: tuple[int, int], causal: bool, scale: float
             ) -> OnlineSoftmaxState | None:
    """The online-softmax state of one query block against one key/value block (``None`` when a
    causal mask hides the whole key block)."""
    if causal and kv_range[0] >= q_range[1]:
        return None
    scores = (q_block * scale) @ k_block.transpose(-2, -1)
    if causal and kv_range[1] - 1 > q_range[0]:
        rows = torch.arange(*q_range)[:, None]
        cols = torch.arange(*kv_range)[None, :]
        scores = scores.masked_fill(cols > rows, float("-inf"))
    return block_state(scores, v_block)


def _fold(state: OnlineSoftmaxState, part: OnlineSoftmaxState | None) -> OnlineSoftmaxState:
    return state if part is None else merge_states(state, part)


def _prepare(q, k, v, world_size, causal):
    _check_qkv(q, k, v)
    require_positive_int("world_size", world_size)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if not q.shape[-2] == k.shape[-2]:
        raise ValueError(f"ring attention splits one sequence: q and k need the same n, "
                         f"got q {shape(q)} and k {shape(k)}")
    if q.shape[:-2] != k.shape[:-2] or q.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"q, k and v need the same batch dimensions, got q {shape(q)}, "
                         f"k {shape(k)}, v {shape(v)}")
    return split_blocks(q.shape[-2], world_size), 1.0 / math.sqrt(q.shape[-1])


def simulate_ring(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int = 2, *,
                  causal: bool = False) -> torch.Tensor:
    """Ring attention's schedule in one process: same blocks, same order, same merges.

    Args:
        q, k: ``(..., n, d_k)``; v: ``(..., n, d_v)``.

    Returns:
        ``(..., n, d_v)``, equal to exact attention (with a causal mask if ``causal``).
    """
    blocks, scale = _prepare(q, k, v, world_size, causal)
    outputs = []
    for rank, (start, end) in enumerate(blocks):
        state = init_state(q.shape[:-2], end - start, v.shape[-1], dtype=q.dtype, device=q.device)
        for step in range(world_size):
            kv_start, kv_end = blocks[(rank - step) % world_size]
            state = _fold(state, _partial(q[..., start:end, :], k[..., kv_start:kv_end, :],
                                          v[..., kv_start:kv_end, :], q_range=(start, end),
                                          kv_range=(kv_start, kv_end), causal=causal, scale=scale))
        outputs.append(finalize(state))
    return torch.cat(outputs, dim=-2)


def free_port() -> int:
    """A TCP port that is free on the loopback address right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _loopback_interface() -> str | None:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((name for name in names if name in ("lo", "lo0")), None)


def _worker(rank: int, world_size: int, port: int, blocks, q_block, k_block, v_block, causal,
            scale, timeout_s: float, results) -> None:
    """One rank of the ring (runs in its own process)."""
    try:
        torch.set_num_threads(1)
        interface = _loopback_interface()
        if interface is not None:  # gloo binds to this interface only: loopback traffic only
            os.environ["GLOO_SOCKET_IFNAME"] = interface
        dist.init_process_group("gloo", init_method=f"tcp://{LOOPBACK}:{port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s))
        try:
            q_range = blocks[rank]
            state = init_state(q_block.shape[:-2], q_block.shape[-2], v_block.shape[-1],
                               dtype=q_block.dtype)
            held_k, held_v, held = k_block.contiguous(), v_block.contiguous(), rank
            log = []
            for step in range(world_size):
                requests, incoming = [], None
                if step < world_size - 1:  # start passing the held block on, compute meanwhile
                    source = (rank - step - 1) % world_size
                    size = blocks[source][1] - blocks[source][0]
                    incoming = (held_k.new_empty((*held_k.shape[:-2], size, held_k.shape[-1])),
                                held_v.new_empty((*held_v.shape[:-2], size, held_v.shape[-1])))
                    requests = [dist.isend(held_k, (rank + 1) % world_size),
                                dist.isend(held_v, (rank + 1) % world_size),
                                dist.irecv(incoming[0], (rank - 1) % world_size),
                                dist.irecv(incoming[1], (rank - 1) % world_size)]
                part = _partial(q_block, held_k, held_v, q_range=q_range, kv_range=blocks[held],
                                causal=causal, scale=scale)
                state = _fold(state, part)
                log.append((step, held, part is not None))
                for request in requests:
                    request.wait()
                if incoming is not None:
                    held_k, held_v, held = incoming[0], incoming[1], source
            # a numpy copy travels by value; a tensor would travel as a shared-memory handle that dies
            # with this process
            results.put(("ok", rank, finalize(state).numpy(), log))
        finally:
            dist.destroy_process_group()
    except Exception:  # reported to the parent, which raises it
        results.put(("error", rank, traceback.format_exc(), None))


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int = 2, *,
                   causal: bool = False, timeout_s: float = 120.0, return_log: bool = False,
                   start_method: str | None = None):
    """Exact attention computed by ``world_size`` processes passing key/value blocks in a ring.

    The processes are started here (``torch.multiprocessing``) and joined before the
    function returns; they talk through ``torch.distributed`` (gloo) on ``127.0.0.1`` only.

    Args:
        q, k: ``(..., n, d_k)``; v: ``(..., n, d_v)`` (CPU tensors, same batch dimensions).
        world_size: number of processes (``<= n``).
        causal: query ``i`` sees keys ``0..i``.
        timeout_s: the whole run must finish in this time, else the processes are stopped and a
            ``TimeoutError`` raised.
        start_method: ``"fork"`` (the default on Linux: the processes start at once, without
            importing torch again; each sets one thread before any work) or ``"spawn"`` (the
            default elsewhere: fresh interpreters).
        return_log: also return ``{rank: [(step, kv_block, computed), ...]}``: which key/value
            block each rank held at each step and whether it had to score it.

    Returns:
        ``(..., n, d_v)`` (and the log when asked), equal to exact attention.
    """
    blocks, scale = _prepare(q, k, v, world_size, causal)
    if q.device.type != "cpu":
        raise ValueError(f"ring_attention runs on CPU tensors (gloo), got device {q.device}")
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")
    if start_method is None:
        start_method = "fork" if sys.platform.startswith("linux") else "spawn"
    if start_method not in ("fork", "spawn", "forkserver"):
        raise ValueError(f"start_method must be 'fork', 'spawn' or 'forkserver', got {start_method!r}")
    context = mp.get_context(start_method)
    results = context.Queue()
    port = free_port()
    processes = []
    for rank, (start, end) in enumerate(blocks):
        args = (rank, world_size, port, blocks, q[..., start:end, :].clone(),
                k[..., start:end, :].clone(), v[..., start:end, :].clone(), causal, scale,
                float(timeout_s), results)
        process = context.Process(target=_worker, args=args, daemon=True)
        process.start()
        processes.append(process)
    outputs, log = {}, {}
    try:
        start_time = time.monotonic()
        while len(outputs) < world_size:
            remaining = timeout_s - (time.monotonic() - start_time)
            if remaining <= 0:
                raise TimeoutError(f"ring attention did not finish within timeout_s={timeout_s}")
            try:
                status, rank, payload, rank_log = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [p for p in processes if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a ring process exited with code {dead[0].exitcode}") from None
                continue
            if status == "error":
                raise RuntimeError(f"rank {rank} of the ring failed:\n{payload}")
            outputs[rank], log[rank] = torch.from_numpy(payload), rank_log
    finally:
        for process in processes:
            process.join(timeout=5.0)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5.0)
        results.close()
    output = torch.cat([outputs[rank] for rank in range(world_size)], dim=-2)
    return (output, log) if return_log else output
