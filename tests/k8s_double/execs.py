"""Exec over the channel protocol, as the kubelet (through the apiserver) serves it: an empty frame
on stdout first, one frame per read of each stream, stdin and the v5 CLOSE signal, the exit status
on channel 3."""

from __future__ import annotations

import asyncio
import json

from aiohttp import WSMsgType, web

from .pods import V5, spawn_exec


async def _pump(stream: asyncio.StreamReader, ws: web.WebSocketResponse, channel: int) -> None:
    while chunk := await stream.read(32 * 1024):
        if ws.closed:
            continue  # keep reading so the process never blocks on a full pipe, as a kubelet does
        try:
            await ws.send_bytes(bytes([channel]) + chunk)
        except (ConnectionResetError, RuntimeError):
            pass


async def _feed_stdin(ws: web.WebSocketResponse, proc: asyncio.subprocess.Process, protocol: str) -> None:
    async for msg in ws:
        if msg.type != WSMsgType.BINARY or not msg.data:
            continue
        channel, data = msg.data[0], msg.data[1:]
        if channel == 255 and protocol == V5 and data[:1] == b"\x00" and proc.stdin:
            proc.stdin.close()  # v5 CLOSE signal for stdin
        elif channel == 0 and proc.stdin and not proc.stdin.is_closing():
            proc.stdin.write(data)
            try:
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass
        # channel 4 (resize) means nothing without a tty


def exec_status(code: int, command: list[str]) -> bytes:
    """The metav1.Status the kubelet writes on channel 3 when the command ends."""
    if code == 0:
        return json.dumps({"metadata": {}, "status": "Success"}).encode()
    return json.dumps({
        "metadata": {}, "status": "Failure",
        "message": f"command terminated with non-zero exit code: error executing command {command}, "
                   f"exit code {code}",
        "reason": "NonZeroExitCode", "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }).encode()


async def run_exec(double, pod, ws: web.WebSocketResponse, command: list[str], *, stdin: bool,  # type: ignore[no-untyped-def]
                   protocol: str) -> None:
    await ws.send_bytes(b"\x01")  # empty frame on the lowest open output channel: "connected"
    proc = await spawn_exec(pod, command, stdin=stdin)
    feeder = asyncio.create_task(_feed_stdin(ws, proc, protocol))
    assert proc.stdout and proc.stderr
    await asyncio.gather(_pump(proc.stdout, ws, 1), _pump(proc.stderr, ws, 2))
    code = await proc.wait()
    pod.procs.discard(proc)
    # The runtime reports death by signal N as exit code 128+N.
    code = 128 - code if code < 0 else code
    if not ws.closed:
        try:
            await ws.send_bytes(b"\x03" + exec_status(code, command))
            await ws.close()
        except (ConnectionResetError, RuntimeError):
            pass
    feeder.cancel()
