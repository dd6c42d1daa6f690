"""A drag sends many moves: under the kernel's running event loop they coalesce into one redraw
of the last state; without a loop (scripts, tests, ``set``) every change draws at once."""

from __future__ import annotations

import asyncio

import pytest

from attn_helpers.widgets.core import COALESCE_S
from attn_helpers.widgets.start_here import warmup_frame, warmup_widget


def test_a_burst_of_moves_under_a_running_loop_draws_the_first_at_once_then_once_the_last_state():
    widget = warmup_widget()

    async def drag():
        start = widget.renders
        for temperature in (0.2, 0.5, 2.0, 3.0, 4.0):
            widget.controls["temperature"].value = temperature
        during = widget.renders - start  # the first move at once; the rest wait for the burst
        await asyncio.sleep(10 * COALESCE_S)
        return during, widget.renders - start

    assert asyncio.run(drag()) == (1, 2)
    assert widget.frame.readouts == warmup_frame(4.0).readouts
    assert widget.controls["temperature"].value == 4.0


def test_a_lone_move_under_a_running_loop_is_drawn_at_once():
    widget = warmup_widget()

    async def moves():
        drawn = []
        for temperature in (0.3, 0.6):
            start = widget.renders
            widget.controls["temperature"].value = temperature
            drawn.append(widget.renders - start)  # no timer: the picture is there already
            await asyncio.sleep(10 * COALESCE_S)  # the learner looks, then moves again
        return drawn

    assert asyncio.run(moves()) == [1, 1]
    assert widget.frame.readouts == warmup_frame(0.6).readouts


def test_set_inside_a_running_loop_draws_at_once_and_cancels_the_pending_redraw():
    widget = warmup_widget()

    async def run():
        start = widget.renders
        widget.controls["temperature"].value = 0.2   # drawn at once
        widget.controls["temperature"].value = 0.3   # pending: it came during the burst
        readouts = widget.set(causal=True)  # a notebook cell reads the result at once
        await asyncio.sleep(10 * COALESCE_S)
        return readouts, widget.renders - start

    readouts, renders = asyncio.run(run())
    assert renders == 2 and readouts == widget.readouts
    assert widget.frame.readouts == warmup_frame(0.3, causal=True).readouts


def test_reading_the_widget_draws_a_waiting_move_first():
    widget = warmup_widget()

    async def run():
        start = widget.renders
        widget.controls["temperature"].value = 0.2   # drawn at once
        widget.controls["temperature"].value = 5.0   # waiting: it came during the burst
        frame, error, renders = widget.frame, widget.error, widget.renders - start
        await asyncio.sleep(10 * COALESCE_S)  # the timer finds nothing left to draw
        return frame, error, renders, widget.renders - start

    frame, error, renders, later = asyncio.run(run())
    assert error is None and renders == later == 2
    assert frame.readouts == warmup_frame(5.0).readouts


@pytest.mark.slow
def test_a_burst_of_comm_updates_in_a_real_kernel_coalesces():
    """20 ``comm_msg`` updates of a slider sent at once to an ipykernel, as a browser drag sends
    them: fewer than 20 pictures (how many fewer depends on the machine), ending on the last."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        def run(code: str) -> str:
            msg_id, out = client.execute(code), []
            while True:
                message = client.get_iopub_msg(timeout=60)
                if message["parent_header"].get("msg_id") != msg_id:
                    continue
                if message["msg_type"] == "stream":
                    out.append(message["content"]["text"])
                if message["msg_type"] == "error":
                    raise AssertionError("\n".join(message["content"]["traceback"]))
                if (message["msg_type"] == "status"
                        and message["content"]["execution_state"] == "idle"):
                    return "".join(out)

        model_id = run("from attn_helpers.widgets.positional_encoding import positional_widget\n"
                       "w = positional_widget()\nprint(w.controls['position'].model_id, end='')")
        values = [(7 * i + 3) % 24 for i in range(20)]
        for value in values:
            client.session.send(client.shell_channel.socket, "comm_msg", {
                "comm_id": model_id,
                "data": {"method": "update", "state": {"value": value}, "buffer_paths": []}})
        run("import time; time.sleep(0.2)")  # let the kernel's loop finish the burst
        renders, shown = map(int, run("print(w.renders, w.frame.position)").split())
        assert shown == values[-1]
        assert renders < len(values), renders
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
