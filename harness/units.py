"""Units of the link model, converted in one place.

Scenarios give bandwidth in Gbps (10^9 bit/s) and one-way delay in ms; the cost model, the simulator and
the strategies compute in bytes/s and seconds; tc takes bit/s and microseconds. Scalars or numpy arrays.
"""
from __future__ import annotations

BITS_PER_BYTE = 8


def gbps_to_bits_per_s(gbps):
    return gbps * 1e9


def gbps_to_bytes_per_s(gbps):
    return gbps * 1e9 / BITS_PER_BYTE


def bits_to_bytes(bits):
    return bits / BITS_PER_BYTE


def ms_to_s(ms):
    return ms / 1e3


def us_to_s(us):
    return us / 1e6


def ms_to_us(ms):
    return ms * 1000


def bytes_per_s_to_gbps(bytes_per_s):
    return bytes_per_s * BITS_PER_BYTE / 1e9


def s_to_ms(s):
    return s * 1e3
