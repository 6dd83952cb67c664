"""Measurement program of `net verify --timeline`, run once per device in the emulated cluster (per-device mode).

`python -m harness.network.timeline_probe SPEC OUT_DIR`: SPEC (JSON) has "mode" (rate | delay), "pairs"
([src, dst] device ids) and "duration_s". Each device plays its parts of every pair, on threads:
  rate: the sender writes one TCP stream as fast as it goes; the receiver counts the bytes that arrive in
        BIN_S bins of time.monotonic() (one clock for every process of the kernel, and the controller's).
  delay: the sender sends RATE_PPS numbered UDP datagrams a second, each with its send time; the receiver
        keeps (send time, arrival time): the one-way delay of each, on one clock.
Each receiver writes OUT_DIR/<mode>-<src>-<dst>.json when the duration is over.
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

BIN_S = 0.1
RATE_PPS = 200
PORT = 5301
CHUNK = 64 << 10
CONNECT_TIMEOUT_S = 10.0


def _rate_receiver(addr: str, port: int, end: float) -> list[list[float]]:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(1)
    srv.settimeout(max(0.1, end - time.monotonic()))
    bins: dict[int, int] = {}
    try:
        conn, _ = srv.accept()
    except socket.timeout:
        return []
    conn.settimeout(0.2)
    with conn:
        while time.monotonic() < end:
            try:
                got = len(conn.recv(1 << 20))
            except socket.timeout:
                continue
            if not got:
                break
            k = int(time.monotonic() / BIN_S)
            bins[k] = bins.get(k, 0) + got
    return [[k * BIN_S, b] for k, b in sorted(bins.items())]


def _rate_sender(addr: str, port: int, end: float) -> None:
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
        while time.monotonic() < end:
            try:
                s.send(data)
            except socket.timeout:
                continue
            except OSError:
                return


def _delay_receiver(addr: str, port: int, end: float) -> list[list[float]]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, port))
    s.settimeout(0.2)
    got = []
    while time.monotonic() < end:
        try:
            data = s.recv(256)
        except socket.timeout:
            continue
        seq, sent = struct.unpack("!Id", data[:12])
        got.append([seq, sent, time.monotonic()])
    return got


def _delay_sender(addr: str, port: int, end: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    seq, start = 0, time.monotonic()
    while True:
        due = start + seq / RATE_PPS
        if due > end:
            return
        time.sleep(max(0.0, due - time.monotonic()))
        s.sendto(struct.pack("!Id", seq, time.monotonic()) + bytes(100), (addr, port))
        seq += 1


def main(spec_path: str, out_dir: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    me = int(os.environ["HARNESS_DEVICE"])
    peers = json.loads(Path(os.environ["HARNESS_PEERS"]).read_text())
    mode, end = spec["mode"], time.monotonic() + float(spec["duration_s"])
    receive, send = (_rate_receiver, _rate_sender) if mode == "rate" else (_delay_receiver, _delay_sender)
    threads, results = [], {}
    for k, (src, dst) in enumerate(spec["pairs"]):
        port = PORT + k
        if dst == me:
            def rx(src=src, dst=dst, port=port):
                results[(src, dst)] = receive(peers[dst], port, end)
            threads.append(threading.Thread(target=rx))
    for t in threads:  # receivers listen first
        t.start()
    for k, (src, dst) in enumerate(spec["pairs"]):
        if src == me:
            t = threading.Thread(target=send, args=(peers[dst], PORT + k, end))
            t.start()
            threads.append(t)
    for t in threads:
        t.join()
    for (src, dst), series in results.items():
        tmp = Path(out_dir) / f".{mode}-{src}-{dst}.json"
        tmp.write_text(json.dumps(series))
        os.replace(tmp, Path(out_dir) / f"{mode}-{src}-{dst}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
