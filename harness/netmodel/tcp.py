"""TCP as every part of the harness counts it: a segment's headers (the payload share of a shaped link's
bytes, net verify's goodput target, the emulated runs' rates), slow start, and how long one connection
takes to deliver a message (the simulator's transport model).

Headers. HTB on a veth counts skb->len: the Ethernet frame without preamble, FCS or gap. A full frame of
MTU 1500 carries MSS = MTU - 52 = 1448 payload bytes (IPv4 20, TCP 20, timestamps 12: on in Linux) in
MTU + 14 bytes, so a shaped rate R delivers 1448/1514 = 0.956 R of payload (`tcp_efficiency`).

Messages. 
A link is a rate R (TCP's payload rate: the scenario's bandwidth; on an emulated link, which shapes whole
frames, tcp_efficiency of it), a one-way delay a and a round trip r. The message of b bytes is sent in round trips (a fluid model of Linux's TCP
without loss, which the emulated links' netem queues, sized from the bandwidth-delay product, give):
- a round sends min(cwnd, W) bytes, W = min(tcp_rmem max / 2, tcp_wmem max): Linux 6.1 advertises half
  of the receive buffer (tcp_adv_win_scale = 1) and keeps no more unacknowledged data than the send
  buffer. The congestion window cwnd doubles every round trip (slow start: every ACK lets out two
  segments, no loss ends it) up to 2 W: Linux lets it grow to twice what was in flight;
- a round whose window covers the path (the link is still sending when the first ACK comes back) turns
  into a continuous stream: the rest goes at R. A window below the bandwidth-delay product sends one
  window per round trip;
- a connection in use holds cwnd = 2 W, unless it sat idle longer than its retransmission timeout
  (RTO = r + 200 ms, Linux's floor on the RTT variance, rounded up to the kernel's clock tick: Linux keeps
  both in jiffies) with `slow_start_after_idle` on: then Linux halves it once per RTO of silence, down to
  the initial window of 10 segments (tcp_cwnd_restart);
- a link may hold a token bucket (the emulated link's HTB burst, network/plan.py: `burst_bytes`; a
  real path has none): its tokens refill at R while the link is idle and let that many bytes through at
  once. The last byte arrives one delay after it left.
A library may stripe a peer's data over several connections (`sockets`: NCCL's socket transport on AWS's ENA
opens 16, netmodel/links.py): each carries an equal share at an equal share of the rate, so in this fluid model
they move together as one connection with `sockets` times the window, the initial window and the ceiling.
The last-byte time is the message's time; its first byte leaves at 0. Times are arrays: every argument
broadcasts, so one call prices every pair, size and idle time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Ethernet header counted by HTB on a veth/NIC (skb->len; no preamble/FCS on a virtual link).
ETH_HEADER_BYTES = 14
#: IPv4 (20) + TCP (20) + TCP timestamp option (12, on by default in Linux).
TCP_IP_HEADER_BYTES = 52
#: the Ethernet MTU every emulated link and every modelled path has
MTU = 1500
#: RFC 6928 / Linux TCP_INIT_CWND, segments
INITIAL_WINDOW_SEGMENTS = 10
#: Linux TCP_RTO_MIN: the RTT variance term of the RTO never goes below it
RTO_MIN_S = 0.2
#: clock ticks per second (CONFIG_HZ): Debian's user-mode Linux kernel (the emulated cluster's) and Debian's
#: amd64 kernels (the hosts the simulator stands for)
UML_HZ = 100
HOST_HZ = 250
MAX_ROUNDS = 100_000


def mss(mtu: int = MTU) -> int:
    """A full segment's payload."""
    return mtu - TCP_IP_HEADER_BYTES


def frame_bytes(mtu: int = MTU) -> int:
    """A full segment's frame, as HTB counts it."""
    return mtu + ETH_HEADER_BYTES


def tcp_efficiency(mtu: int = MTU) -> float:
    """TCP payload per byte HTB counts: MSS / frame = (MTU - 52) / (MTU + 14), 0.9564 at MTU 1500."""
    return mss(mtu) / frame_bytes(mtu)


def slow_start_rounds(window_bytes: float, segment_bytes: float) -> float:
    """Round trips slow start takes from the initial window to `window_bytes` (doubling every round trip)."""
    return math.log2(max(window_bytes / segment_bytes, INITIAL_WINDOW_SEGMENTS) / INITIAL_WINDOW_SEGMENTS)


@dataclass(frozen=True)
class TcpPath:
    """One connection's path: payload rate (bytes/s), one-way delay and round trip (s), the ceiling of the
    bytes in flight W, the segment size, slow start after idle, and the link's token bucket (payload bytes)."""

    rate_Bps: np.ndarray
    delay_s: np.ndarray
    rtt_s: np.ndarray
    window_bytes: float
    mss_bytes: int = MTU - TCP_IP_HEADER_BYTES
    slow_start_after_idle: bool = True
    bucket_bytes: np.ndarray | float = 0.0
    hz: int = HOST_HZ
    sockets: int = 1  # connections the data is striped over (window, initial window and ceiling are all of them)

    @classmethod
    def of(cls, rate_Bps, delay_s, rtt_s, transport, mtu: int = MTU, bucket_bytes=0.0, hz: int = HOST_HZ,
           sockets: int = 1) -> "TcpPath":
        """`transport`: resolved settings (harness/scenario/transport.py: no `auto` left)."""
        window = min(int(transport.rmem_max_bytes) / 2, int(transport.wmem_max_bytes)) * sockets
        return cls(np.asarray(rate_Bps, dtype=float), np.asarray(delay_s, dtype=float), np.asarray(rtt_s, dtype=float),
                   float(window), mss(mtu), bool(transport.slow_start_after_idle), bucket_bytes, hz, sockets)

    def initial_window(self) -> float:
        """Bytes a connection (all its sockets) may send first, or after slow start restarts it."""
        return INITIAL_WINDOW_SEGMENTS * self.mss_bytes * self.sockets

    def rto_s(self) -> np.ndarray:
        return np.ceil((self.rtt_s + RTO_MIN_S) * self.hz - 1e-9) / self.hz

    def full_cwnd(self) -> np.ndarray:
        """The congestion window of a connection in use: Linux grows it to twice what was in flight."""
        return np.broadcast_to(np.float64(2 * self.window_bytes), np.shape(self.rtt_s)).copy()

    def restarted(self, cwnd, silence_s) -> np.ndarray:
        """The window a connection holds after its sender was silent `silence_s` (tcp_cwnd_restart: halved
        once per RTO, down to the initial window; unchanged with slow start after idle off)."""
        cwnd = np.asarray(cwnd, dtype=float)
        if not self.slow_start_after_idle:
            return np.broadcast_to(cwnd, np.broadcast(cwnd, silence_s, self.rtt_s).shape).copy()
        halvings = np.floor(np.maximum(np.asarray(silence_s, dtype=float), 0.0) / self.rto_s())
        iw = np.minimum(cwnd, self.initial_window())
        return np.maximum(iw, cwnd / np.exp2(np.clip(halvings, 0, 60)))

    def initial_cwnd(self, idle_s) -> np.ndarray:
        """The congestion window (bytes) a message starts with `idle_s` after the previous one arrived (the
        sender's silence began one delay before that arrival)."""
        return self.restarted(self.full_cwnd(), np.asarray(idle_s, dtype=float) + self.delay_s)

    def message_seconds(self, nbytes, idle_s=0.0) -> np.ndarray:
        """Seconds from a message's first write to its last byte's arrival (see the module docstring)."""
        return self.transfer(nbytes, self.initial_cwnd(idle_s), idle_s)[0]

    def transfer(self, nbytes, cwnd, idle_s=0.0) -> tuple[np.ndarray, np.ndarray]:
        """(seconds to the last byte's arrival, congestion window after) of a message that starts with
        window `cwnd`, `idle_s` after the link's previous byte arrived. The window grows only while the
        flow fills it (Linux's tcp_is_cwnd_limited: up to twice what was in flight), so a connection
        that carries small messages keeps a small window."""
        b, idle, R, a, r, bucket, cwnd = np.broadcast_arrays(
            np.asarray(nbytes, dtype=float), np.asarray(idle_s, dtype=float), self.rate_Bps, self.delay_s,
            self.rtt_s, np.asarray(self.bucket_bytes, dtype=float), np.asarray(cwnd, dtype=float))
        left = b.copy()
        t = np.zeros(b.shape)
        cwnd = cwnd.copy()
        local = np.isinf(R)  # a device to itself: no link
        refill = lambda dt: np.where(local, 0.0, dt * np.where(local, 0.0, R))  # noqa: E731
        tokens = np.minimum(bucket, refill(idle + a))  # the link was idle since the last byte left
        done = np.zeros(b.shape, dtype=bool)
        finish = np.zeros(b.shape)
        after = cwnd.copy()
        for _ in range(MAX_ROUNDS):
            if done.all():
                break
            sent = np.minimum(np.minimum(cwnd, self.window_bytes), left)
            busy = np.maximum(sent - tokens, 0.0) / R  # the link's time for this round's bytes
            stream = busy >= r  # still sending when the first ACK returns: no more gaps
            last = (sent >= left) | stream
            end = t + np.where(stream, np.maximum(left - tokens, 0.0) / R, busy) + a
            finish = np.where(~done & last, end, finish)
            grown = np.where(cwnd < 2 * sent, cwnd + sent, cwnd)
            # a stream of at least a window more fills the window until it stops growing
            streamed = np.maximum(grown, np.minimum(2 * self.window_bytes, 2 * np.minimum(left, self.window_bytes)))
            after = np.where(~done & last, np.where(stream, streamed, grown), after)
            done |= last
            left = left - sent
            tokens = np.minimum(bucket, np.maximum(tokens - sent, 0.0) + refill(r - busy))
            t = t + r
            cwnd = np.minimum(grown, 2 * self.window_bytes)
        return finish, after
