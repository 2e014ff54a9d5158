"""The exporter's HTTP server: a listen queue that takes a scrape storm and a
bounded pool of handler threads.

prometheus-client's start_http_server listens with socketserver's default
backlog of 5 and starts a thread per connection: 500 parallel scrapes on
127.0.0.1 overflowed the queue (1,634 ListenOverflows) and 37-60 of them
timed out at 20 s. Here the queue holds 1,024 connections (the kernel caps it
at net.core.somaxconn, 4,096 on current kernels), at most WORKERS handlers
run at once (the accept loop waits for a free one, the rest wait in the
queue), and a connection goes to a handler only once its whole request head
has arrived: until then it waits in a selector, and one whose head is not
whole REQUEST_TIMEOUT_S after its acceptance (it sends nothing, or trickles
a header line every few seconds) is closed there, so slow clients never hold
the pool.
The answer goes back the same way: a handler makes it (the WSGI app writes
into memory, the cached snapshot's bytes by reference, never copied), sends
what the socket takes at once and leaves the rest to the selector, which
writes it as the client reads and closes a client that has taken nothing for
WRITE_TIMEOUT_S (or not all of it in WRITE_MAX_S). A client that never reads a large /snapshot.json (a relayed
host's GPUs make it megabytes) holds a socket buffer, not a handler: before,
16 of them re-opened every 8 s kept every handler in a blocking send and each
/metrics scrape waited 9 s.
A scrape only serialises the cached families (exporter.SnapshotExporter), so
a few threads answer hundreds of scrapes a second.
"""

from __future__ import annotations

import collections
import io
import selectors
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

BACKLOG = 1024
WORKERS = 8
REQUEST_TIMEOUT_S = 5.0     # from a connection's acceptance to its whole request head (exporter --request-timeout)
MAX_WAITING = 4096      # accepted connections not done yet: their head not whole, or their answer not sent
WRITE_TIMEOUT_S = 5.0   # a client that takes none of its answer for this long is closed
WRITE_MAX_S = 60.0      # and one that has not taken all of it this long after it was made (a trickling
                        # reader would keep an old snapshot's megabytes alive)
MAX_HEAD = 16384        # a scrape's request head is a few hundred bytes


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S         # the socket's timeout while a handler holds it (it reads from memory)

    def setup(self) -> None:
        super().setup()
        # The request head was read whole before a handler was given the
        # connection (PoolServer): the handler reads it from memory.
        self.rfile.close()
        self.rfile = io.BytesIO(self.server.take_head(self.connection))
        # The answer is written into memory; the server sends it (PoolServer._handle).
        self.wfile.close()
        self.wfile = _Answer()

    def finish(self) -> None:
        self.server.keep_answer(self.connection, self.wfile.chunks)
        self.rfile.close()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class _Answer:
    """A handler's wfile: the writes kept as they come (the body by reference)."""

    closed = False

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.chunks.append(data if isinstance(data, bytes) else bytes(data))    # the cached body: no copy
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class PoolServer(WSGIServer):
    """Accept, and read each connection's request head in a selector, with
    one deadline per request (REQUEST_TIMEOUT_S from its acceptance): a
    connection goes to a handler only once its head is whole. One that sends
    nothing, or trickles a header line every 2 s, is closed at its deadline
    and never holds a handler (a timeout per read would let such clients keep
    all WORKERS busy, each line starting its timeout again)."""

    request_queue_size = BACKLOG
    allow_reuse_address = True

    def __init__(self, address: tuple, workers: int = WORKERS, request_timeout: float = REQUEST_TIMEOUT_S) -> None:
        self.request_timeout = request_timeout
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="eagle3-exporter-http")
        self._slots = threading.BoundedSemaphore(workers)
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._heads: dict[socket.socket, bytes] = {}
        self._heads_lock = threading.Lock()
        self._answers: dict[socket.socket, list[bytes]] = {}
        self._to_write: collections.deque = collections.deque()     # (conn, chunks) for the selector
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        super().__init__(address, _QuietHandler)

    def keep_answer(self, conn: socket.socket, chunks: list[bytes]) -> None:
        with self._heads_lock:
            self._answers[conn] = chunks

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"w")
        except OSError:
            pass        # already woken (its buffer full), or closed

    def take_head(self, conn: socket.socket) -> bytes:
        with self._heads_lock:
            return self._heads.pop(conn, b"")

    def serve_forever(self, poll_interval: float = 0.25) -> None:
        sel = selectors.DefaultSelector()
        self.socket.setblocking(False)
        sel.register(self.socket, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        listening = True
        waiting: dict[socket.socket, list] = {}      # conn -> [deadline, addr, bytes so far]
        writing: dict[socket.socket, list] = {}      # conn -> [deadline, chunks left (memoryviews), last deadline]
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(poll_interval):
                    if key.data is None:
                        self._accept(sel, waiting)
                    elif key.data is _WAKE:
                        self._take_writes(sel, writing)
                    elif key.data is _WRITE:
                        self._write(sel, writing, key.fileobj)
                    else:
                        self._read(sel, waiting, key.fileobj)
                now = time.monotonic()
                for conn in [c for c, (deadline, _a, _h) in waiting.items() if deadline < now]:
                    self._drop(sel, waiting, conn)
                for conn in [c for c, (deadline, _left, _last) in writing.items() if deadline < now]:
                    self._drop(sel, writing, conn)
                # Too many in flight: leave the rest in the kernel's queue until some are answered.
                busy = len(waiting) + len(writing)
                if listening and busy >= MAX_WAITING:
                    sel.unregister(self.socket)
                    listening = False
                elif not listening and busy < MAX_WAITING:
                    sel.register(self.socket, selectors.EVENT_READ, None)
                    listening = True
        finally:
            for conn in [*waiting, *writing]:
                conn.close()
            while self._to_write:
                self._to_write.popleft()[0].close()
            sel.close()
            self._stopped.set()

    def _take_writes(self, sel: selectors.BaseSelector, writing: dict) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        while self._to_write:
            conn, left = self._to_write.popleft()
            sel.register(conn, selectors.EVENT_WRITE, _WRITE)
            now = time.monotonic()
            writing[conn] = [now + min(WRITE_TIMEOUT_S, WRITE_MAX_S), left, now + WRITE_MAX_S]

    def _write(self, sel: selectors.BaseSelector, writing: dict, conn: socket.socket) -> None:
        entry = writing[conn]
        try:
            sent = _send(conn, entry[1])
        except OSError:
            self._drop(sel, writing, conn)      # the client went away
            return
        if not entry[1]:
            sel.unregister(conn)
            del writing[conn]
            self.shutdown_request(conn)
        elif sent:
            entry[0] = min(time.monotonic() + WRITE_TIMEOUT_S, entry[2])

    def _accept(self, sel: selectors.BaseSelector, waiting: dict) -> None:
        deadline = time.monotonic() + self.request_timeout
        while len(waiting) < MAX_WAITING:
            try:
                conn, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return      # out of file descriptors: the rest wait in the queue
            conn.setblocking(False)
            sel.register(conn, selectors.EVENT_READ, addr)
            waiting[conn] = [deadline, addr, b""]

    def _read(self, sel: selectors.BaseSelector, waiting: dict, conn: socket.socket) -> None:
        entry = waiting[conn]
        try:
            data = conn.recv(MAX_HEAD)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        entry[2] += data
        head = entry[2]
        if not data or len(head) > MAX_HEAD:
            self._drop(sel, waiting, conn)      # closed before its head ended, or no scrape's head
            return
        if b"\r\n\r\n" not in head and b"\n\n" not in head:
            return
        sel.unregister(conn)
        del waiting[conn]
        conn.setblocking(True)
        with self._heads_lock:
            self._heads[conn] = head
        self._slots.acquire()       # the rest wait, read, while the pool is busy answering
        self._pool.submit(self._handle, conn, entry[1])

    @staticmethod
    def _drop(sel: selectors.BaseSelector, waiting: dict, conn: socket.socket) -> None:
        sel.unregister(conn)
        del waiting[conn]
        conn.close()

    def _handle(self, request: Any, client_address: Any) -> None:
        left: list[memoryview] = []
        try:
            self.finish_request(request, client_address)
            with self._heads_lock:
                chunks = self._answers.pop(request, [])
            left = [memoryview(c) for c in chunks if c]
            request.setblocking(False)
            _send(request, left)        # most answers go at once; the rest as the client reads
        except Exception:  # noqa: BLE001 - one bad connection never ends the server
            left = []
        finally:
            self.take_head(request)
            with self._heads_lock:
                self._answers.pop(request, None)
            if left and not self._stop.is_set():
                self._to_write.append((request, left))
                self._wake()
            else:
                self.shutdown_request(request)
            self._slots.release()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake()
        self._stopped.wait(5)

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        while self._to_write:        # handed over by a handler as the loop ended
            self._to_write.popleft()[0].close()
        self._wake_r.close()
        self._wake_w.close()


_WAKE = object()        # the selector's key data: the handlers' wake-up socket
_WRITE = object()       # a connection whose answer is being sent


def _send(conn: socket.socket, left: list[memoryview]) -> int:
    """Send what a non-blocking socket takes now from `left` (consumed in place); the bytes sent."""
    sent = 0
    while left:
        try:
            n = conn.send(left[0])
        except (BlockingIOError, InterruptedError):
            return sent
        sent += n
        if n == len(left[0]):
            left.pop(0)
        else:
            left[0] = left[0][n:]
    return sent


def _family(host: str, port: int) -> socket.AddressFamily:
    """IPv6 for an IPv6 address (`--host ::`), else IPv4 (as prometheus-client picks)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return infos[0][0]


def start_server(app: Any, host: str, port: int,
                 request_timeout: float = REQUEST_TIMEOUT_S) -> tuple[PoolServer, threading.Thread]:
    """Listen on host:port (OSError when it cannot) and serve `app` (WSGI) in a daemon thread;
    a connection has `request_timeout` seconds from its acceptance to send its whole request head."""
    family = _family(host, port)
    server_class = type("PoolServer", (PoolServer,), {"address_family": family})
    server = server_class((host, port), request_timeout=request_timeout)
    server.set_app(app)
    thread = threading.Thread(target=server.serve_forever, name="eagle3-exporter-accept", daemon=True)
    thread.start()
    return server, thread
