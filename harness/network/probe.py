"""Measurement program run inside the emulated cluster (launcher mode) by `net verify`.

`python -m harness.network.probe SPEC OUT`: SPEC (JSON) lists the RTT pairs and the
bulk rounds; OUT receives the measurements. One server per device (forked, entered
into its namespace) answers two kinds of TCP connections:
  ping: 1-byte ping-pong (TCP_NODELAY); the client keeps the median of several.
  bulk: one stream for warmup_s + measure_s; the *receiver* counts the bytes that arrive
        in the window [first byte + warmup_s, + measure_s] (slow start excluded) and
        sends the goodput back when the sender closes.
Pairs run in rounds in which every device sends to one peer and receives from one, and no
pair runs beside its reverse (whose link carries its ACKs); each pair measures its RTT on
the idle link first, then its bulk stream. One process per client and one connection per
server at a time, so no Python GIL convoy adds milliseconds to an RTT. Pairs that miss
their target are measured again (spec "retries") and the result says how many attempts
it took: on a loaded host the user-mode kernel can be descheduled for tens of ms.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import struct
import sys
import threading
import time

from .netns import enter
from .verify import bulk_rounds, goodput_ok, rtt_ok

PORT = 5201
HEADER = 128


def _header(doc: dict) -> bytes:
    raw = json.dumps(doc).encode()
    if len(raw) > HEADER:
        raise ValueError(f"probe header too long: {raw!r}")
    return raw.ljust(HEADER)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return buf


# -- server ------------------------------------------------------------------
def _serve_conn(conn: socket.socket) -> None:
    try:
        _serve(conn)
    except OSError:
        pass  # the client went away: it reports its own error


def _serve(conn: socket.socket) -> None:
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hdr = json.loads(_recv_exact(conn, HEADER))
        if hdr["mode"] == "ping":
            while True:
                b = conn.recv(1)
                if not b:
                    return
                conn.sendall(b)
        warm, meas = hdr["warmup_s"], hdr["measure_s"]
        total, first, a, b = 0, None, None, None
        while True:
            chunk = conn.recv(1 << 20)
            now = time.monotonic()
            if not chunk:
                break
            if first is None:
                first = now
            if a is None and now >= first + warm:
                a = (now, total)
            total += len(chunk)
            if b is None and a is not None and now >= first + warm + meas:
                b = (now, total)
        ok = a is not None and b is not None and b[0] > a[0]
        res = {"bytes": total, "goodput_bps": (b[1] - a[1]) * 8 / (b[0] - a[0]) if ok else None,
               "window_s": b[0] - a[0] if ok else None}
        conn.sendall(json.dumps(res).encode())


def _server(addr: str, ready_w: int) -> None:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, PORT))
    srv.listen(256)
    sys.setswitchinterval(0.0005)
    os.write(ready_w, b"R")
    os.close(ready_w)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_serve_conn, args=(conn,), daemon=True).start()


# -- clients -----------------------------------------------------------------
def _ping(dst_addr: str, pings: int) -> dict:
    with socket.create_connection((dst_addr, PORT), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(_header({"mode": "ping"}))
        samples = []
        for k in range(pings + 1):
            t = time.perf_counter()
            s.sendall(b"p")
            _recv_exact(s, 1)
            if k:  # the first one warms up (ARP, cwnd)
                samples.append((time.perf_counter() - t) * 1e3)
    return {"rtt_ms": statistics.median(samples), "rtt_samples_ms": samples}


def _bulk(dst_addr: str, warmup_s: float, measure_s: float) -> dict:
    payload = b"\0" * (1 << 16)
    with socket.create_connection((dst_addr, PORT), timeout=60) as s:
        s.sendall(_header({"mode": "bulk", "warmup_s": round(warmup_s, 3), "measure_s": round(measure_s, 3)}))
        end = time.monotonic() + warmup_s + measure_s + 0.5
        while time.monotonic() < end:
            s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        raw = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            raw += chunk
    return json.loads(raw)


def _fork(netns_path: str, fn) -> tuple[int, int]:
    """Run fn() in a child inside the namespace; its JSON result comes back through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            enter(netns_path)
            out = fn()
        except BaseException as e:  # noqa: BLE001 - reported as data
            out, code = {"error": f"{type(e).__name__}: {e}"}, 1
        data = json.dumps(out).encode()
        os.write(w, struct.pack("!I", len(data)) + data)
        os._exit(code)
    os.close(w)
    return pid, r


def _collect(children: list[tuple[int, int]]) -> list[dict]:
    out = []
    for pid, r in children:
        with os.fdopen(r, "rb") as f:
            raw = f.read()
        os.waitpid(pid, 0)
        n = struct.unpack("!I", raw[:4])[0] if len(raw) >= 4 else 0
        out.append(json.loads(raw[4:4 + n]) if n else {"error": "no result"})
    return out


def _pair(dst_addr: str, pings: int, warmup_s: float, measure_s: float, barrier) -> dict:
    """RTT first, while every link of the round is idle; then (after all pairs pinged) bulk."""
    out = {}
    try:
        out.update(_ping(dst_addr, pings))
        if barrier is not None:
            barrier()
        out.update(_bulk(dst_addr, warmup_s, measure_s))
    except (OSError, ValueError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


class _Barrier:
    """Children write one byte when done pinging; the parent then releases them all at once."""

    def __init__(self, parties: int):
        self.parties = parties
        self.done_r, self.done_w = os.pipe()
        self.go_r, self.go_w = os.pipe()

    def wait(self) -> None:  # in a child
        os.write(self.done_w, b"P")
        os.read(self.go_r, 1)

    def release_when_all_done(self) -> None:  # in the parent
        os.close(self.done_w)
        got = 0
        while got < self.parties:
            b = os.read(self.done_r, self.parties - got)
            if not b:
                break  # a child died before reaching the barrier
            got += len(b)
        os.write(self.go_w, b"G" * self.parties)
        for fd in (self.done_r, self.go_r, self.go_w):
            os.close(fd)


def _run_round(devs: dict, rnd: list[dict], pings: int, sync: bool) -> list[dict]:
    barrier = _Barrier(len(rnd)) if sync else None
    kids = [_fork(devs[p["src"]]["netns_path"],
                  (lambda p=p: _pair(devs[p["dst"]]["addr"], pings, p["warmup_s"], p["measure_s"],
                                     barrier.wait if barrier else None)))
            for p in rnd]
    if barrier:
        barrier.release_when_all_done()
    return _collect(kids)


def _passes(p: dict, res: dict) -> bool:
    return (rtt_ok(res.get("rtt_ms"), p["rtt_target_ms"])
            and goodput_ok(res.get("goodput_bps"), p["goodput_target_bps"]))


def main(spec_path: str, out_path: str) -> int:
    cluster = json.load(open(os.environ["HARNESS_CLUSTER"]))
    spec = json.load(open(spec_path))
    devs = {d["index"]: d for d in cluster["devices"]}
    servers = []
    for d in devs.values():
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                enter(d["netns_path"])
                _server(d["addr"], w)
            finally:
                os._exit(1)
        os.close(w)
        if os.read(r, 1) != b"R":
            raise RuntimeError(f"probe server of device {d['index']} did not start")
        os.close(r)
        servers.append(pid)
    try:
        results: dict[tuple[int, int], dict] = {}
        rounds = spec["rounds"]
        for attempt in range(1 + spec.get("retries", 0)):
            for k, rnd in enumerate(rounds):
                t0 = time.monotonic()
                for p, res in zip(rnd, _run_round(devs, rnd, spec["pings"], spec.get("sync", False))):
                    results[(p["src"], p["dst"])] = {"src": p["src"], "dst": p["dst"], **res,
                                                     "attempts": attempt + 1}
                print(f"probe: attempt {attempt + 1} round {k + 1}/{len(rounds)} ({len(rnd)} pairs) "
                      f"in {time.monotonic() - t0:.1f} s", flush=True)
            failed = [p for rnd in rounds for p in rnd if not _passes(p, results[(p["src"], p["dst"])])]
            if not failed:
                break
            by_pair = {(p["src"], p["dst"]): p for p in failed}
            rounds = [[by_pair[sd] for sd in rnd] for rnd in bulk_rounds(list(by_pair))]
    finally:
        for pid in servers:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(list(results.values()), f)
    os.replace(tmp, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
