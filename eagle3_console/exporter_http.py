"""The exporter's HTTP server: a listen queue that takes a scrape storm and a
bounded pool of handler threads.

prometheus-client's start_http_server listens with socketserver's default
backlog of 5 and starts a thread per connection: 500 parallel scrapes on
127.0.0.1 overflowed the queue (1,634 ListenOverflows) and 37-60 of them
timed out at 20 s. Here the queue holds 1,024 connections (the kernel caps it
at net.core.somaxconn, 4,096 on current kernels), at most WORKERS handlers
run at once (the accept loop waits for a free one, the rest wait in the
queue), and a connection goes to a handler only once it has sent something:
one that sends nothing (slowloris, a port check) waits in a selector and is
closed after REQUEST_TIMEOUT_S, so idle clients never hold the pool; a
handler's reads time out after the same while.
A scrape only serialises the cached families (exporter.SnapshotExporter), so
a few threads answer hundreds of scrapes a second.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

BACKLOG = 1024
WORKERS = 8
REQUEST_TIMEOUT_S = 5.0
MAX_WAITING = 4096      # accepted connections that have not sent their request yet


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S         # socket timeout on each read of the request

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class PoolServer(WSGIServer):
    request_queue_size = BACKLOG
    allow_reuse_address = True

    def __init__(self, address: tuple, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="eagle3-exporter-http")
        self._slots = threading.BoundedSemaphore(workers)
        self._stop = threading.Event()
        self._stopped = threading.Event()
        super().__init__(address, _QuietHandler)

    def serve_forever(self, poll_interval: float = 0.25) -> None:
        """Accept, and hand a connection to a handler once it has sent
        something: one that sends nothing waits in a selector (not in a
        handler) and is closed after REQUEST_TIMEOUT_S."""
        sel = selectors.DefaultSelector()
        self.socket.setblocking(False)
        sel.register(self.socket, selectors.EVENT_READ, None)
        listening = True
        waiting: dict[socket.socket, tuple[float, Any]] = {}
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(poll_interval):
                    if key.data is None:
                        self._accept(sel, waiting)
                        continue
                    conn = key.fileobj
                    sel.unregister(conn)
                    _, addr = waiting.pop(conn)
                    self._slots.acquire()       # the rest wait, queued, while the pool is busy
                    self._pool.submit(self._handle, conn, addr)
                now = time.monotonic()
                for conn in [c for c, (deadline, _) in waiting.items() if deadline < now]:
                    sel.unregister(conn)
                    del waiting[conn]
                    conn.close()
                # Too many waiting: leave the rest in the kernel's queue until some are answered.
                if listening and len(waiting) >= MAX_WAITING:
                    sel.unregister(self.socket)
                    listening = False
                elif not listening and len(waiting) < MAX_WAITING:
                    sel.register(self.socket, selectors.EVENT_READ, None)
                    listening = True
        finally:
            for conn in waiting:
                conn.close()
            sel.close()
            self._stopped.set()

    def _accept(self, sel: selectors.BaseSelector, waiting: dict) -> None:
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while len(waiting) < MAX_WAITING:
            try:
                conn, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return      # out of file descriptors: the rest wait in the queue
            conn.setblocking(True)
            sel.register(conn, selectors.EVENT_READ, addr)
            waiting[conn] = (deadline, addr)

    def _handle(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - one bad connection never ends the server
            pass
        finally:
            self.shutdown_request(request)
            self._slots.release()

    def shutdown(self) -> None:
        self._stop.set()
        self._stopped.wait(5)

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _family(host: str, port: int) -> socket.AddressFamily:
    """IPv6 for an IPv6 address (`--host ::`), else IPv4 (as prometheus-client picks)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return infos[0][0]


def start_server(app: Any, host: str, port: int) -> tuple[PoolServer, threading.Thread]:
    """Listen on host:port (OSError when it cannot) and serve `app` (WSGI) in a daemon thread."""
    family = _family(host, port)
    server_class = type("PoolServer", (PoolServer,), {"address_family": family})
    server = server_class((host, port))
    server.set_app(app)
    thread = threading.Thread(target=server.serve_forever, name="eagle3-exporter-accept", daemon=True)
    thread.start()
    return server, thread
