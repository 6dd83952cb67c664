"""What HetPipe's plans share: its bytes per parameter, N_m's range and the error type (fp32: harness/sim/cnn.py)."""
from __future__ import annotations

from ...compute import training_bytes_per_param
from ...sim.cnn import BYTES_PER_VALUE, DTYPE, GIB, CNNSimError  # noqa: F401

# value, gradient and SGD momentum (compute.training_bytes_per_param) and the wave's aggregated update
PARAM_BYTES = training_bytes_per_param(BYTES_PER_VALUE) + BYTES_PER_VALUE
MAX_NM = 32  # N_m tried up to this many minibatches in flight


class HetPipeError(CNNSimError):
    """A plan that cannot be made (unknown policy, a VW that cannot hold the model); one line."""
