"""The sandbox's one door out: a TCP listener on the sandbox's own 127.0.0.1 that pipes every
connection to the proxy's unix socket, bound into the sandbox (which has no network of its own).

    python -I forwarder.py --socket /run/forge/proxy.sock --port 8700 -- CMD ARGS...

Or, for a pod on another machine than the site (sandbox/site_relay.py), to a TCP relay that first
gets the rollout's token in a fixed-size preamble line:

    python3 -I forwarder.py --connect HOST:PORT --token TOKEN --port 8080 -- [CMD ARGS...]

Or the other way, for a task's service in a sandbox of its own (sandbox/confine.py): a unix socket the
host connects to, each connection piped to the service's 127.0.0.1:PORT in the sandbox's own network:

    python -I forwarder.py --listen-socket /run/forge/listen.sock --to-port 8080 -- CMD ARGS...

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
SITE_PREAMBLE_LEN = 76  # len(site_preamble(64 hex digits))


def site_preamble(token: str) -> bytes:
    """The first bytes of every connection to the site relay: which rollout's site it is for."""
    return f"FORGE-SITE {token}\n".encode("ascii")


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy reader to writer until EOF, then half-close the writer (one direction of a forwarded connection)."""
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


async def _serve(listener: socket.socket, path: str | None, relay: tuple[str, int, bytes] | None = None,
                 to_port: int | None = None) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            if to_port is not None:  # a confined service, on this sandbox's own loopback
                proxy_r, proxy_w = await asyncio.open_connection("127.0.0.1", to_port)
            elif relay is not None:  # (host, port, preamble): the site relay on the forge host
                proxy_r, proxy_w = await asyncio.open_connection(relay[0], relay[1])
                proxy_w.write(relay[2])
            else:
                proxy_r, proxy_w = await asyncio.open_unix_connection(path)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, proxy_w), pipe(proxy_r, client_w))
        client_w.close()
        proxy_w.close()

    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    sep = argv.index("--")
    opts = dict(zip(argv[:sep:2], argv[1:sep:2]))
    command = argv[sep + 1:]
    if "--listen-socket" in opts:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(opts["--listen-socket"])
    else:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", int(opts["--port"])))
    listener.listen(128)
    if os.fork() == 0:  # the server: detached from CMD's stdio so it never holds the exec's pipes open
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        relay = None
        if "--connect" in opts:
            host, _, port = opts["--connect"].rpartition(":")
            relay = (host.strip("[]"), int(port), site_preamble(opts["--token"]))
        to_port = int(opts["--to-port"]) if "--to-port" in opts else None
        asyncio.run(_serve(listener, opts.get("--socket"), relay, to_port))
        os._exit(0)
    listener.close()
    if not command:
        os._exit(0)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
