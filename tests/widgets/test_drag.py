"""A drag sends many moves: under the kernel's running event loop they coalesce into one redraw
of the last state; without a loop (scripts, tests, ``set``) every change draws at once."""

from __future__ import annotations

import asyncio

from attn_helpers.widgets.core import COALESCE_S
from attn_helpers.widgets.start_here import warmup_frame, warmup_widget


def test_a_burst_of_moves_under_a_running_loop_draws_once_the_last_state():
    widget = warmup_widget()

    async def drag():
        start = widget.renders
        for temperature in (0.2, 0.5, 2.0, 3.0, 4.0):
            widget.controls["temperature"].value = temperature
        pending = widget.renders - start  # nothing drawn while the moves keep coming
        await asyncio.sleep(10 * COALESCE_S)
        return pending, widget.renders - start

    assert asyncio.run(drag()) == (0, 1)
    assert widget.frame.readouts == warmup_frame(4.0).readouts
    assert widget.controls["temperature"].value == 4.0


def test_set_inside_a_running_loop_draws_at_once_and_cancels_the_pending_redraw():
    widget = warmup_widget()

    async def run():
        start = widget.renders
        widget.controls["temperature"].value = 0.3
        readouts = widget.set(causal=True)  # a notebook cell reads the result at once
        await asyncio.sleep(10 * COALESCE_S)
        return readouts, widget.renders - start

    readouts, renders = asyncio.run(run())
    assert renders == 1 and readouts == widget.readouts
    assert widget.frame.readouts == warmup_frame(0.3, causal=True).readouts


def test_reading_the_widget_draws_a_waiting_move_first():
    widget = warmup_widget()

    async def run():
        start = widget.renders
        widget.controls["temperature"].value = 0.2
        widget.controls["temperature"].value = 5.0
        frame, error, renders = widget.frame, widget.error, widget.renders - start
        await asyncio.sleep(10 * COALESCE_S)  # the timer finds nothing left to draw
        return frame, error, renders, widget.renders - start

    frame, error, renders, later = asyncio.run(run())
    assert error is None and renders == later == 1
    assert frame.readouts == warmup_frame(5.0).readouts


def test_without_a_loop_every_move_draws():
    widget = warmup_widget()
    start = widget.renders
    for temperature in (0.2, 0.5, 2.0):
        widget.controls["temperature"].value = temperature
    assert widget.renders == start + 3
