"""Containment of os-ken 4.2.x native-hub defects.  `install()` once, before os-ken apps start.

Why each patch exists (all reproduced in tests/test_oskencompat.py):

1. ``hub.TaskExit is Exception`` in the native hub.  `OSKenApp._event_loop` re-raises `hub.TaskExit` to
   leave the loop, so *any* exception in *any* event handler ends that app's event loop; `HubThread.run`
   then swallows it as a normal exit.  Nothing is logged, events pile up in the app's bounded queue, and
   the datapath threads feeding it block forever.  Patch: a private `TaskExit` that only os-ken's own stop
   path could raise, so handler exceptions are logged and the loop goes on.

2. ``hub.kill()`` is a no-op.  `Datapath.serve` kills its send and echo threads and then joins them; the
   send thread sits in ``send_q.get()`` forever, so `serve` never returns, the connection's threads leak
   and DEAD_DISPATCHER (sent by the close that follows `serve`) is never delivered.  Patch: `serve` wakes
   the send thread with a close sentinel and joins with a timeout, so every disconnect is reported and
   its threads end.

3. Hub threads are non-daemon, and the OpenFlow listener blocks in ``accept()`` with no way to stop it,
   so SIGINT cannot end `AppManager.run_apps`.  Patch: hub threads are daemons, and `StreamServer`
   instances are tracked so `close_listeners()` can shut their sockets; the launcher waits for signals
   itself instead of calling `run_apps`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Any

from os_ken.controller import controller as of_controller
from os_ken.lib import hub

LOG = logging.getLogger(__name__)

_state = {"installed": False}
_listeners: list[Any] = []
_lock = threading.Lock()
JOIN_TIMEOUT_S = 2.0


class TaskExit(Exception):
    """Raised by nothing but an explicit stop: handler errors are no longer mistaken for it."""


def _spawn(func: Any, *args: Any, **kwargs: Any) -> threading.Thread:
    raise_error = kwargs.pop("raise_error", False)

    def run() -> None:
        try:
            func(*args, **kwargs)
        except TaskExit:
            pass
        except BaseException:
            if raise_error:
                raise
            LOG.exception("hub thread %s died", getattr(func, "__qualname__", func))

    thread = threading.Thread(target=run, name=f"hub:{getattr(func, '__qualname__', 'task')}", daemon=True)
    thread.start()
    return thread


def _serve(self: Any) -> None:
    """`Datapath.serve` that ends its helper threads when the connection ends."""
    send_thread = hub.spawn(self._send_loop)
    self.send_msg(self.ofproto_parser.OFPHello(self))
    hub.spawn(self._echo_request_loop)
    try:
        self._recv_loop()
    finally:
        self.is_active = False
        queue = self.send_q
        # Wake the sender: the close flag ends its loop.  If the queue is full the sender is busy and will
        # fail on the socket _recv_loop just closed.
        if queue is not None and self._send_q_sem.acquire(blocking=False):
            queue.put((b"", True))
        send_thread.join(JOIN_TIMEOUT_S)
        # The echo thread sleeps up to echo_request_interval and then sees send_q gone; it is a daemon.


class _TrackedStreamServer(hub.StreamServer):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        with _lock:
            _listeners.append(self)

    def serve_forever(self) -> None:
        while True:
            try:
                sock, addr = self.server.accept()
            except OSError:
                return  # closed by close_listeners()
            hub.spawn(self.handle, sock, addr)


def close_listeners() -> None:
    """Stop accepting OpenFlow connections (the listener thread then returns)."""
    with _lock:
        servers = list(_listeners)
        _listeners.clear()
    for server in servers:
        with contextlib.suppress(OSError):
            server.server.shutdown(socket.SHUT_RDWR)
        server.server.close()


def install() -> None:
    with _lock:
        if _state["installed"]:
            return
        if hub.HUB_TYPE != "native":
            raise RuntimeError(
                f"fabriclab needs os-ken's native hub, not {hub.HUB_TYPE!r} (unset OSKEN_HUB_TYPE)"
            )
        hub.TaskExit = TaskExit
        hub.spawn = _spawn
        hub.StreamServer = _TrackedStreamServer
        of_controller.StreamServer = _TrackedStreamServer
        of_controller.Datapath.serve = _serve
        _state["installed"] = True


__all__ = ["TaskExit", "close_listeners", "install"]
