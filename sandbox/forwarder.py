"""The sandbox's one door out: a TCP listener on the sandbox's own 127.0.0.1 that pipes every
connection to the proxy's unix socket, bound into the sandbox (which has no network of its own).

    python -I forwarder.py --socket /run/forge/proxy.sock --port 8700 -- CMD ARGS...

It binds the port first, then forks: the child serves, the parent execs CMD. So CMD never races the
listener, and the server lives in CMD's pid namespace and dies with it. Standard library only: it runs
under the sandbox's interpreter (`-I`: no PYTHON* variables, no user site, no script dir on sys.path,
so nothing the agent wrote can be imported into it).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

_CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            writer.close()


async def _serve(listener: socket.socket, path: str) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            proxy_r, proxy_w = await asyncio.open_unix_connection(path)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, proxy_w), _pipe(proxy_r, client_w))
        client_w.close()
        proxy_w.close()

    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    sep = argv.index("--")
    opts = dict(zip(argv[:sep:2], argv[1:sep:2]))
    command = argv[sep + 1:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(opts["--port"])))
    listener.listen(128)
    if os.fork() == 0:  # the server: detached from CMD's stdio so it never holds the exec's pipes open
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        asyncio.run(_serve(listener, opts["--socket"]))
        os._exit(0)
    listener.close()
    if not command:
        os._exit(0)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
