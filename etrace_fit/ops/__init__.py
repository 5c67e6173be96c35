"""ETP primitives: where a weight meets an input, visible to the compiler.

Public functions: :func:`matmul`, :func:`elementwise`, :func:`conv`. The compiler
reads :func:`etp_op_info` for each primitive's metadata. Read ``registry.py`` first.
"""

from .conv import conv, etp_conv_p
from .dense import etp_mm_p, etp_mv_p, matmul
from .elementwise import elementwise, etp_elemwise_p
from .registry import EtpOp, etp_op_info, is_etp_primitive, registered_ops
from .weight_fns import Chain, Masked, Positive, SignConstrained, Standardized

__all__ = [
    "Chain",
    "EtpOp",
    "Masked",
    "Positive",
    "SignConstrained",
    "Standardized",
    "conv",
    "elementwise",
    "etp_conv_p",
    "etp_elemwise_p",
    "etp_mm_p",
    "etp_mv_p",
    "etp_op_info",
    "is_etp_primitive",
    "matmul",
    "registered_ops",
]
