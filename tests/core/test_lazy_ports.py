"""openforge/lazy.py (a registry's class imported on demand) and openforge/ports.py (a free port from the OS)."""

from __future__ import annotations

import socket

import pytest

from openforge.lazy import lazy_class
from openforge.ports import free_port


def test_lazy_class_imports_the_named_class_and_says_which_part_is_wrong() -> None:
    assert lazy_class("collections", "OrderedDict") is __import__("collections").OrderedDict
    with pytest.raises(LookupError, match="collections defines no class nope"):
        lazy_class("collections", "nope")
    with pytest.raises(LookupError, match="defines no class namedtuple"):  # a function is not a class
        lazy_class("collections", "namedtuple")
    with pytest.raises(ImportError):
        lazy_class("openforge.no_such_backend", "Backend")


def test_free_port_is_one_a_server_can_bind_on_that_host() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free when asked: nothing listens there
        s.listen(1)
        assert free_port() != port  # a port in use is never handed out
