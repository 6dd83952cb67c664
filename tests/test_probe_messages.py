"""The transfer-curves probe's message exchange (network/probe.py), on loopback: a message whose tail arrives
while its receiver waits is answered, and a step that stalls fails in its stall time with the connection's
TCP state (before: a CI run lost its deadline to a socket's 120 s default, 5 times in 14)."""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from harness.network import probe


def _pair():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname(), timeout=10)
    conn, _ = srv.accept()
    srv.close()
    return cli, conn


def _unacked(s: socket.socket) -> int:
    return struct.unpack_from("24I", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104), 8)[4]


def _asleep(tid: int) -> bool:
    with open(f"/proc/self/task/{tid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


def _until(cond, what: str, deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"{what}: not within {deadline_s} s")
        time.sleep(0.005)


def test_a_message_whose_tail_arrives_while_the_receiver_waits_is_answered():
    """The receiver waits for its low-water mark; the part already there and the tail that follows make it,
    the tail alone does not (a blocking read that took the first part waited for the mark beyond it)."""
    cli, conn = _pair()
    server = threading.Thread(target=probe._serve_conn, args=(conn,), daemon=True)
    server.start()
    with cli:
        cli.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cli.sendall(probe._header({"mode": "messages"}))
        head, tail = 5000, probe.MESSAGE_LOWAT_BYTES - 1000
        cli.sendall(struct.pack("!Q", head + tail) + bytes(head))
        _until(lambda: _unacked(cli) == 0 and _asleep(server.native_id), "the first part taken, the receiver waiting")
        t0 = time.monotonic()
        cli.sendall(bytes(tail))
        arrived = struct.unpack("!d", probe._recv_exact(cli, 8))[0]
        assert t0 <= arrived <= time.monotonic()
        cli.sendall(struct.pack("!Q", 0))
    server.join(10)
    assert not server.is_alive()


def test_a_stalled_step_fails_in_its_stall_time_with_the_connections_state():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)  # the kernel accepts and buffers; nobody answers
    with srv:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError) as err:
            probe._messages("127.0.0.1", [{"bytes": 1000, "idle_s": 0.0, "rep": 0}], 2000, 0.3,
                            port=srv.getsockname()[1])
        assert time.monotonic() - t0 < 5
    msg = str(err.value)
    assert msg.startswith("trial 1/1 primer: timed out (tcp state 1 ") and "unacked 0" in msg, msg
