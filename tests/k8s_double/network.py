"""The pod network, when asked for (`KubeDouble(pod_network=True, node_ports=...)`): each pod in a
network namespace of its own, as under a real CNI, so its 127.0.0.1, its ports and its abstract unix
sockets (an X display's) are its own, and one pod cannot connect to what another listens on.

What a pod can reach of the outside is the node: NODE_IP (the pod's status.hostIP) at the ports in
`node_ports`, each carried to the same port on the host's 127.0.0.1 (where the tests' proxy and site
relay listen), as a pod reaches a host port through the node's address. Nothing else is reachable:
not the host's loopback, not another pod.

The listener for NODE_IP:port is made inside the pod's namespace by a thread that enters it with
setns(2) (network namespaces may be entered per thread) and returns; the socket stays in the pod's
namespace, and the double's loop accepts on it and opens the host-side connection.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import subprocess
import threading
from typing import Any

from openforge.sandbox.forwarder import pipe

NODE_IP = "10.0.0.1"
_CLONE_NEWNET = 0x40000000


def _listen_in_netns(ns_pid: int, host: str, port: int) -> socket.socket:
    libc = ctypes.CDLL(None, use_errno=True)
    out: dict[str, Any] = {}

    def work() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/proc/{ns_pid}/ns/net", os.O_RDONLY)
        try:
            if libc.setns(target, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into the pod's network namespace")
            try:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                sock.listen(128)
                sock.setblocking(False)
                out["sock"] = sock
            finally:
                if libc.setns(own, _CLONE_NEWNET) != 0:  # this thread ends next either way
                    out["restore"] = ctypes.get_errno()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            out["error"] = exc
        finally:
            os.close(own)
            os.close(target)

    thread = threading.Thread(target=work, name="pod-netns")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["sock"]


async def pod_network_up(pod, ports: tuple[int, ...]) -> None:  # type: ignore[no-untyped-def]
    """NODE_IP on the pod's loopback and a listener there per node port (bwrap brought `lo` up)."""
    done = await asyncio.to_thread(subprocess.run, ["nsenter", "-t", str(pod.ns_pid), "-n", "ip", "addr", "add",
                                                    f"{NODE_IP}/32", "dev", "lo"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pod network: {done.stderr.strip()}")
    for port in ports:
        sock = _listen_in_netns(pod.ns_pid, NODE_IP, port)

        async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int = port) -> None:
            pod.carried.add(asyncio.current_task())
            try:
                host_r, host_w = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                writer.close()
                return
            pod.carried_writers.update((writer, host_w))
            try:
                await asyncio.gather(pipe(reader, host_w), pipe(host_r, writer))
            finally:
                writer.close()
                host_w.close()
                pod.carried_writers.difference_update((writer, host_w))

        pod.servers.append(await asyncio.start_server(carry, sock=sock))


async def pod_network_down(pod) -> None:  # type: ignore[no-untyped-def]
    """The node ports' listeners closed and every carried connection cut (the namespace is gone)."""
    for server in pod.servers:
        server.close()
    pod.servers.clear()
    for writer in list(pod.carried_writers):
        if writer.transport is not None:
            writer.transport.abort()
    pending = [t for t in pod.carried if not t.done()]
    if pending:
        await asyncio.wait(pending, timeout=5)
    pod.carried.clear()
