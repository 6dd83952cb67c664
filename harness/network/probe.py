"""Measurement program run inside the emulated cluster (launcher mode) by `net verify`.

`python -m harness.network.probe SPEC OUT`: SPEC (JSON) lists the RTT pairs and the
bulk rounds; OUT receives the measurements. One server per device (forked, entered
into its namespace) answers two kinds of TCP connections:
  ping: 1-byte ping-pong (TCP_NODELAY); the client keeps the median of several.
  bulk: one stream; the *receiver* counts the bytes that arrive in the window
        [first byte + warmup_s, + measure_s] (slow start excluded), then sends the goodput
        back; the sender stops on reading it and resets the connection (no drain).
Pairs run in rounds in which every device sends to one peer and receives from one, and no
pair runs beside its reverse (whose link carries its ACKs); each pair (one process) measures
its RTT first, then its bulk stream. (Pinging all pairs at once was tried: on UML's single
CPU, 50 concurrent ping-pong processes add milliseconds of scheduling delay.) Pairs that miss
their target are measured again (spec "retries") and the result says how many attempts
it took: on a loaded host the user-mode kernel can be descheduled for tens of ms.
"""
from __future__ import annotations

import json
import os
import select
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
RECV_BYTES = 8 << 20
#: The receiver wakes up when this much time's worth of data (at the target rate) is there:
#: the window edges move by ~this much (0.1 % of a 2 s window) and it costs few syscalls.
RECV_EVERY_S = 0.002
SEND_BACKOFF_S = 0.002
#: at most a quarter of the smallest receive window (tcp_rmem's default 128 KiB buffer holds a 64 KiB window):
#: a low-water mark the window cannot reach would stall the receiver
MESSAGE_LOWAT_BYTES = 16 << 10


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
        if hdr["mode"] == "messages":
            return _serve_messages(conn)
        if hdr["mode"] == "ping":
            while True:
                b = conn.recv(1)
                if not b:
                    return
                conn.sendall(b)
        warm, meas = hdr["warmup_s"], hdr["measure_s"]
        # wake up once per ~RECV_EVERY_S of data, not per packet: syscalls are costly in UML
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, max(1, int(hdr["rate_Bps"] * RECV_EVERY_S)))
        total, first, a = 0, None, None
        buf = bytearray(RECV_BYTES)
        while True:
            got = conn.recv_into(buf)
            now = time.monotonic()
            if not got:
                conn.sendall(json.dumps({"bytes": total, "goodput_bps": None, "window_s": None}).encode())
                return
            if first is None:
                first = now
            if a is None and now >= first + warm:
                a = (now, total)
            total += got
            if a is not None and now >= first + warm + meas:
                break
        res = {"bytes": total, "goodput_bps": (total - a[1]) * 8 / (now - a[0]), "window_s": now - a[0]}
        conn.sendall(json.dumps(res).encode())
        try:  # the sender stops when it reads this; discard what is still in flight
            while conn.recv_into(buf):
                pass
        except OSError:
            pass


def _serve_messages(conn: socket.socket) -> None:
    """Transfer curves (curves.py): messages of <8-byte size><payload>; after a message's last byte the
    receiver answers with the time it arrived (CLOCK_MONOTONIC: one kernel holds every namespace)."""
    buf = bytearray(RECV_BYTES)
    view = memoryview(buf)
    readable = select.poll()
    readable.register(conn, select.POLLIN)
    while True:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)  # the 8-byte size, alone when the message is 0
        size = struct.unpack("!Q", _recv_exact(conn, 8))[0]
        if size == 0:
            return
        left = size
        while left:
            # wake up when the rest (or a large chunk) is there, not per packet: syscalls are costly in UML.
            # poll, then read what is there: a blocking recv that took part of it would wait for the low-water
            # mark in bytes *beyond* that part, which a message's last bytes may never reach (a stall)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, min(left, MESSAGE_LOWAT_BYTES))
            readable.poll()
            got = conn.recv_into(view[:min(left, RECV_BYTES)])
            if not got:
                raise ConnectionError("peer closed")
            left -= got
        conn.sendall(struct.pack("!d", time.monotonic()))


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
        samples, late = [], []
        for k in range(pings + 1):
            t = time.perf_counter()
            s.sendall(b"p")
            _recv_exact(s, 1)
            if k:  # the first one warms up (ARP, cwnd)
                samples.append((time.perf_counter() - t) * 1e3)
                late.append(_wake_late_ms())
    return {"rtt_ms": statistics.median(samples), "rtt_samples_ms": samples, "wake_late_ms": late}


def _wake_late_ms(sleep_s: float = 0.001) -> float:
    """How late this kernel wakes a sleeper now: a loaded host runs the guest's timers late, and an RTT waits on
    two of them (the netem delay each way), so a ping is late by about twice this."""
    t = time.perf_counter()
    time.sleep(sleep_s)
    return (time.perf_counter() - t - sleep_s) * 1e3


def _bulk(dst_addr: str, warmup_s: float, measure_s: float, rate_bps: float) -> dict:
    """Send until the receiver reports its measurement (it does when its window closes)."""
    payload = b"\0" * (1 << 16)
    with socket.create_connection((dst_addr, PORT), timeout=60) as s:
        s.sendall(_header({"mode": "bulk", "warmup_s": round(warmup_s, 3), "measure_s": round(measure_s, 3),
                           "rate_Bps": int(rate_bps / 8)}))
        s.setblocking(False)
        deadline = time.monotonic() + warmup_s + measure_s + 60
        raw, full = b"", False
        while time.monotonic() < deadline:
            # after a short write the buffer is full: wait a moment instead of spinning on send()
            readable, writable, _ = select.select([s], [] if full else [s], [], SEND_BACKOFF_S if full else 0.1)
            full = False
            if readable:
                chunk = s.recv(4096)
                raw += chunk
                if not chunk or raw.endswith(b"}"):
                    break
            elif writable:
                try:
                    full = s.send(payload) < len(payload)
                except BlockingIOError:
                    full = True
        # do not wait for the unsent backlog to drain at the emulated rate: reset
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if not raw.endswith(b"}"):
        raise TimeoutError("no measurement from the receiver")
    return json.loads(raw)


def _tcp_state(s: socket.socket) -> str:
    """The connection's state as the kernel sees it (struct tcp_info's head): where a stall stands."""
    try:
        raw = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    except OSError:
        return "no tcp_info"
    b = struct.unpack_from("8B", raw)
    (rto, _ato, _mss, _rmss, unacked, sacked, lost, retrans, _f, last_sent, _ls, last_recv, _la, _pmtu, _rss, rtt,
     _rv, _ssth, cwnd, _amss, _reo, _rrtt, _rsp, total_retrans) = struct.unpack_from("24I", raw, 8)
    return (f"tcp state {b[0]} ca {b[1]} backoff {b[4]} rto {rto / 1e3:.0f}ms rtt {rtt / 1e3:.1f}ms cwnd {cwnd} "
            f"unacked {unacked} sacked {sacked} lost {lost} retrans {retrans}/{total_retrans} "
            f"last sent {last_sent}ms last recv {last_recv}ms ago")


def _messages(dst_addr: str, trials: list[dict], primer_bytes: int, stall_s: float, port: int = PORT) -> dict:
    """One connection (TCP_NODELAY, as gloo's): per trial, a primer message that opens the window, the
    trial's idle time after its arrival, then the message; its time runs from the first write to the
    arrival of its last byte at the receiver. A step (connect, a message) that takes `stall_s` fails with
    the connection's state."""
    biggest = max([primer_bytes] + [t["bytes"] for t in trials])
    payload = memoryview(bytes(biggest))
    out = []
    step = "connect"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(stall_s)
        try:
            s.connect((dst_addr, port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(_header({"mode": "messages"}))

            def send(n: int) -> tuple[float, float]:
                t0 = time.monotonic()
                s.sendall(struct.pack("!Q", n))
                s.sendall(payload[:n])
                return t0, struct.unpack("!d", _recv_exact(s, 8))[0]

            for k, t in enumerate(trials):
                step = f"trial {k + 1}/{len(trials)} primer"
                arrived = send(primer_bytes)[1] if primer_bytes else time.monotonic()
                pause = arrived + t["idle_s"] - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                step = f"trial {k + 1}/{len(trials)} ({t['bytes']} B)"
                t0, t1 = send(t["bytes"])
                out.append({**t, "seconds": t1 - t0, "idle_measured_s": t0 - arrived})
            s.sendall(struct.pack("!Q", 0))
        except (OSError, ConnectionError) as e:
            raise type(e)(f"{step}: {e} ({_tcp_state(s)})") from None
    return {"trials": out}


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


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of this kernel's CPUs: a saturated CPU makes timers (and links) late."""
    vals = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals) - idle, sum(vals)


def _pair(dst_addr: str, pings: int, warmup_s: float, measure_s: float, rate_bps: float) -> dict:
    """RTT first (before this pair's stream starts), then the bulk stream."""
    out = _safe(_ping, dst_addr, pings)
    if "error" not in out:
        out.update(_safe(_bulk, dst_addr, warmup_s, measure_s, rate_bps))
    return out


def _run_round(devs: dict, rnd: list[dict], pings: int) -> list[dict]:
    kids = [_fork(devs[p["src"]]["netns_path"],
                  (lambda p=p: _pair(devs[p["dst"]]["addr"], pings, p["warmup_s"], p["measure_s"],
                                     p["goodput_target_bps"])))
            for p in rnd]
    return _collect(kids)


def _safe(fn, *args) -> dict:
    try:
        return fn(*args)
    except (OSError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


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
        if "messages" in spec:
            return _curves(devs, spec, out_path)
        results: dict[tuple[int, int], dict] = {}
        pairs = {(p["src"], p["dst"]): p for rnd in spec["rounds"] for p in rnd}
        rounds = spec["rounds"]
        for attempt in range(1 + spec.get("retries", 0)):
            for k, rnd in enumerate(rounds):
                t0, cpu0 = time.monotonic(), _cpu_times()
                for p, res in zip(rnd, _run_round(devs, rnd, spec["pings"])):
                    results[(p["src"], p["dst"])] = {"src": p["src"], "dst": p["dst"], **res,
                                                     "attempts": attempt + 1}
                busy, total = (b - a for a, b in zip(cpu0, _cpu_times()))
                print(f"probe: attempt {attempt + 1} round {k + 1}/{len(rounds)} ({len(rnd)} pairs) "
                      f"in {time.monotonic() - t0:.1f} s, CPU busy {100 * busy / max(total, 1):.0f} %",
                      flush=True)
            failed = [sd for sd, p in pairs.items()
                      if not (rtt_ok(results[sd].get("rtt_ms"), p["rtt_target_ms"])
                              and goodput_ok(results[sd].get("goodput_bps"), p["goodput_target_bps"]))]
            if not failed:
                break
            rounds = [[pairs[sd] for sd in rnd] for rnd in bulk_rounds(failed)]
    finally:
        for pid in servers:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(list(results.values()), f)
    os.replace(tmp, out_path)
    return 0


def _curves(devs: dict, spec: dict, out_path: str) -> int:
    """Each pair on its own (nothing else on the kernel's one CPU), one after another."""
    results = []
    for k, p in enumerate(spec["messages"]):
        t0 = time.monotonic()
        for attempt in range(1 + spec.get("retries", 0)):  # a connection that failed is measured again
            kid = _fork(devs[p["src"]]["netns_path"],
                        lambda p=p: _messages(devs[p["dst"]]["addr"], p["trials"], p["primer_bytes"], p["stall_s"]))
            res = _collect([kid])[0]
            if "error" not in res:
                break
            print(f"probe: transfer curves ({p['src']}->{p['dst']}) attempt {attempt + 1}: {res['error']}", flush=True)
        results.append({"src": p["src"], "dst": p["dst"], **res, "attempts": attempt + 1})
        print(f"probe: transfer curves {k + 1}/{len(spec['messages'])} ({p['src']}->{p['dst']}) in "
              f"{time.monotonic() - t0:.1f} s{' ' + res['error'] if 'error' in res else ''}", flush=True)
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f)
    os.replace(tmp, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
