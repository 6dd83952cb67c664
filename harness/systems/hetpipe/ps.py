"""HetPipe's parameter server, sharded over the nodes: a shard serves over TCP from a thread of its host rank.

A shard holds the global weights (fp32) of its blocks and, per block, how many waves each virtual
worker (VW) has pushed. `push` adds a VW's aggregated update of a wave (w_global += u, HetPipe Sec. 4)
and answers when it was applied; `pull` waits until every VW has pushed `needs` waves of the blocks it
names to wait on, then sends the weights asked for and the global version they hold (the fewest
waves of any VW in them). The traffic is plain TCP between the ranks' addresses, so in the emulated
cluster it crosses the same shaped links as the pipelines' activations.

Message: 8-byte big-endian header length, a JSON header, then the payload (fp32 values of the
header's `names`, in order). A peer that goes away fails the other side with a one-line error.
"""
from __future__ import annotations

import json
import socket
import struct
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ...train import wire

_HEADER = struct.Struct(">Q")


class PSError(RuntimeError):
    """A parameter-server shard or its client went away or answered with an error; one line."""


def _recv_exact(sock: socket.socket, n: int, who: str) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise PSError(f"{who} closed the connection")
        got += k
    return bytes(buf)


def send_message(sock: socket.socket, header: dict, arrays: list[np.ndarray] = ()) -> None:
    head = json.dumps(header).encode()
    payload = b"".join(np.ascontiguousarray(a, dtype=np.float32).tobytes() for a in arrays)
    sock.sendall(_HEADER.pack(len(head)) + head + _HEADER.pack(len(payload)) + payload)
    wire.charge(len(payload))  # payload only, as every count of wire.py


def recv_message(sock: socket.socket, who: str) -> tuple[dict, bytes]:
    (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, who))
    header = json.loads(_recv_exact(sock, n, who))
    (m,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, who))
    return header, _recv_exact(sock, m, who)


class ShardServer:
    """One shard: `weights` (name -> fp32 array) of `blocks`, for `vws` virtual workers. Serves each
    client from its own thread; `close()` stops it."""

    def __init__(self, weights: dict[str, np.ndarray], block_of: dict[str, int], vws: int, addr: str,
                 timeout_s: float):
        self.weights = {k: np.array(v, dtype=np.float32) for k, v in weights.items()}
        self.block_of = block_of
        self.pushed = {b: [0] * vws for b in set(block_of.values())}  # block -> waves each VW pushed
        self.cond = threading.Condition()
        self.timeout_s = timeout_s
        self.sock = socket.create_server((addr, 0))
        self.address = f"{addr}:{self.sock.getsockname()[1]}"
        self.closed = False
        self.threads = [threading.Thread(target=self._accept, name="ps-accept", daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            t = threading.Thread(target=self._serve, args=(conn,), name="ps-client", daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while not self.closed:
                try:
                    header, payload = recv_message(conn, "a client")
                except (PSError, OSError):
                    return  # the client left (its rank reports why)
                try:
                    reply, arrays = self._handle(header, payload)
                except PSError as e:
                    reply, arrays = {"error": str(e)}, []
                try:
                    send_message(conn, reply, arrays)
                except OSError:
                    return

    def _handle(self, h: dict, payload: bytes) -> tuple[dict, list[np.ndarray]]:
        if h["op"] == "push":
            values = np.frombuffer(payload, dtype=np.float32)
            with self.cond:
                at = 0
                for name in h["names"]:
                    w = self.weights[name]
                    w += values[at:at + w.size].reshape(w.shape)
                    at += w.size
                for b in {self.block_of[n] for n in h["names"]}:
                    self.pushed[b][h["vw"]] += 1
                self.cond.notify_all()
                return {"applied": time.monotonic()}, []
        if h["op"] == "pull":
            blocks = h["wait_blocks"] or sorted(self.pushed)
            ready = lambda: min(min(self.pushed[b]) for b in blocks) >= h["needs"]  # noqa: E731
            with self.cond:
                if not self.cond.wait_for(lambda: ready() or self.closed, timeout=self.timeout_s) or self.closed:
                    raise PSError(f"pull of VW {h['vw']} waited {self.timeout_s:g} s for every VW's wave "
                                  f"{h['needs'] - 1} (pushed per block: {self.pushed})")
                version = min(min(self.pushed[b]) for b in blocks)
                arrays = [self.weights[n].copy() for n in h["names"]]
            return {"version": version, "served": time.monotonic()}, arrays
        raise PSError(f"unknown operation {h['op']!r}")

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.sock.close()


class ShardClient:
    """A rank's connection to one shard; operations run in order on one thread of their own, so a push
    goes out while the rank computes and a later pull is served after it."""

    def __init__(self, address: str, name: str, timeout_s: float):
        host, _, port = address.rpartition(":")
        self.name = name
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.sock.settimeout(2 * timeout_s)  # a pull waits up to the shard's timeout_s for the slowest VW
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ps-client")

    def _call(self, header: dict, arrays: list[np.ndarray]) -> tuple[dict, bytes]:
        try:
            send_message(self.sock, header, arrays)
            reply, payload = recv_message(self.sock, self.name)
        except OSError as e:  # a reset, a broken pipe, a timeout
            raise PSError(f"{self.name}: {type(e).__name__}: {e}") from None
        if "error" in reply:
            raise PSError(f"{self.name}: {reply['error']}")
        return reply, payload

    def push(self, vw: int, wave: int, names: list[str], updates: list[np.ndarray]) -> Future:
        """Send a wave's update; the future's result is when the shard applied it (time.monotonic)."""
        return self.pool.submit(lambda: self._call({"op": "push", "vw": vw, "wave": wave, "names": names},
                                                   updates)[0]["applied"])

    def pull(self, vw: int, needs: int, wait_blocks: list[int], names: list[str], shapes: list) -> Future:
        """The future's result: (global version, [arrays of `names`]) once every VW pushed `needs` waves of
        `wait_blocks` (all of the shard's when empty)."""
        def call():
            reply, payload = self._call({"op": "pull", "vw": vw, "needs": needs, "wait_blocks": wait_blocks,
                                         "names": names}, [])
            values, out, at = np.frombuffer(payload, dtype=np.float32), [], 0
            for shape in shapes:
                size = int(np.prod(shape))
                out.append(values[at:at + size].reshape(shape))
                at += size
            return reply["version"], out
        return self.pool.submit(call)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.sock.close()
