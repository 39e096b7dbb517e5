"""`free_port(host)`: a TCP port nobody listens on now, for a server forge starts (an engine, the router,
torchrun's rendezvous, a task's service). The OS picks it; it is free when asked, not reserved."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free on `host` (IPv6 when the host has a colon)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
