"""Measurement program of `net verify --timeline`, run once per device in the emulated cluster (per-device mode).

`python -m harness.network.timeline_probe SPEC OUT_DIR`: SPEC (JSON) has "mode" (rate | delay), "pairs"
([src, dst] device ids) and "duration_s". Each device plays its parts of every pair, on threads:
  rate: the sender writes one TCP stream as fast as it goes; the receiver counts the bytes that arrive in
        BIN_S bins of time.monotonic() (one clock for every process of the kernel, and the controller's).
  delay: the sender sends RATE_PPS numbered UDP datagrams a second, each with its send time; the receiver
        keeps (send time, arrival time): the one-way delay of each, on one clock.
The timeline's clock starts when every stream is steady (WARM_S after its first bytes arrived): the last
receiver to be ready marks iteration 0 (timeline_program.note_iteration; run it with timeline_clock="marks"),
so a slow start of the programs (seconds, on a loaded host under UML) never eats the time before a change.
Every part then runs until duration_s after that mark, and each receiver writes OUT_DIR/<mode>-<src>-<dst>.json.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
import time
from pathlib import Path

from .timeline_program import note_iteration

BIN_S = 0.1
RATE_PPS = 200
PORT = 5301
CHUNK = 64 << 10
CONNECT_TIMEOUT_S = 10.0
#: a stream is steady this long after its first bytes arrived (TCP's slow start over, the queues filled)
WARM_S = 1.0
#: every stream steady within this, or the probe fails
READY_TIMEOUT_S = 60.0


class Start:
    """The probe's t = 0, shared by its processes through OUT_DIR (one file system in the cluster's kernel):
    each receiver says when its stream is steady; the last marks iteration 0 and writes the end time."""

    def __init__(self, out_dir: str, mode: str, pairs: list, duration_s: float):
        self.dir, self.mode, self.pairs, self.duration_s = Path(out_dir), mode, pairs, duration_s
        self.deadline = time.monotonic() + READY_TIMEOUT_S
        self._end: float | None = None
        self._checked = 0.0

    def ready(self, src: int, dst: int) -> None:
        (self.dir / f".ready-{self.mode}-{src}-{dst}").touch()
        if not all((self.dir / f".ready-{self.mode}-{s}-{d}").exists() for s, d in self.pairs):
            return  # a later receiver marks
        now = time.monotonic()
        tmp = self.dir / f".start-{self.mode}-{os.getpid()}"
        tmp.write_text(repr(now + self.duration_s))
        try:
            os.link(tmp, self.dir / f".start-{self.mode}")  # the first to get here marks; link is exclusive
        except FileExistsError:
            return
        finally:
            tmp.unlink()
        note_iteration(0, now)

    def over(self) -> bool:
        """True once the duration after t = 0 has passed (or no t = 0 came before the deadline)."""
        now = time.monotonic()
        if self._end is None and now - self._checked > 0.05:
            self._checked = now
            try:
                self._end = float((self.dir / f".start-{self.mode}").read_text())
            except (FileNotFoundError, ValueError):
                pass
        return now >= (self._end if self._end is not None else self.deadline)

    @property
    def started(self) -> bool:
        self.over()
        return self._end is not None


def _rate_receiver(addr: str, port: int, start: Start, ready) -> list[list[float]]:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(1)
    srv.settimeout(max(0.1, start.deadline - time.monotonic()))
    bins: dict[int, int] = {}
    try:
        conn, _ = srv.accept()
    except socket.timeout:
        return []
    conn.settimeout(0.2)
    first, steady = None, False
    with conn:
        while not start.over():
            try:
                got = len(conn.recv(1 << 20))
            except socket.timeout:
                continue
            if not got:
                break
            now = time.monotonic()
            first = now if first is None else first
            if not steady and now - first >= WARM_S:
                steady = True
                ready()
            k = int(now / BIN_S)
            bins[k] = bins.get(k, 0) + got
    return [[k * BIN_S, b] for k, b in sorted(bins.items())]


def _rate_sender(addr: str, port: int, start: Start) -> None:
    data = bytes(CHUNK)
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=1.0)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    s.settimeout(0.5)
    with s:
        while not start.over():
            try:
                s.send(data)
            except socket.timeout:
                continue
            except OSError:
                return


def _delay_receiver(addr: str, port: int, start: Start, ready) -> list[list[float]]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, port))
    s.settimeout(0.2)
    got, steady = [], False
    while not start.over():
        try:
            data = s.recv(256)
        except socket.timeout:
            continue
        seq, sent = struct.unpack("!Id", data[:12])
        now = time.monotonic()
        got.append([seq, sent, now])
        if not steady and now - got[0][2] >= WARM_S:
            steady = True
            ready()
    return got


def _delay_sender(addr: str, port: int, start: Start) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    seq, began = 0, time.monotonic()
    while not start.over():
        due = began + seq / RATE_PPS
        time.sleep(max(0.0, due - time.monotonic()))
        s.sendto(struct.pack("!Id", seq, time.monotonic()) + bytes(100), (addr, port))
        seq += 1


def main(spec_path: str, out_dir: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    me = int(os.environ["HARNESS_DEVICE"])
    peers = json.loads(Path(os.environ["HARNESS_PEERS"]).read_text())
    mode, pairs = spec["mode"], [tuple(p) for p in spec["pairs"]]
    start = Start(out_dir, mode, pairs, float(spec["duration_s"]))
    receive, send = (_rate_receiver, _rate_sender) if mode == "rate" else (_delay_receiver, _delay_sender)
    threads, results = [], {}
    for k, (src, dst) in enumerate(spec["pairs"]):
        port = PORT + k
        if dst == me:
            def rx(src=src, dst=dst, port=port):
                results[(src, dst)] = receive(peers[dst], port, start, lambda: start.ready(src, dst))
            threads.append(threading.Thread(target=rx))
    for t in threads:  # receivers listen first
        t.start()
    for k, (src, dst) in enumerate(spec["pairs"]):
        if src == me:
            t = threading.Thread(target=send, args=(peers[dst], PORT + k, start))
            t.start()
            threads.append(t)
    for t in threads:
        t.join()
    if not start.started:
        print(f"timeline_probe: the {mode} streams were not all steady within {READY_TIMEOUT_S:g} s", file=sys.stderr)
        return 1
    for (src, dst), series in results.items():
        tmp = Path(out_dir) / f".{mode}-{src}-{dst}.json"
        tmp.write_text(json.dumps(series))
        os.replace(tmp, Path(out_dir) / f"{mode}-{src}-{dst}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
