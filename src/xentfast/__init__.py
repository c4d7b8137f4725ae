"""xentfast: cross-entropy losses whose forward and backward passes are exactly right, and fast.

Every public function documents an error bound in ULPs, enforced by the tests against the mpmath
reference in :mod:`xentfast.reference`.  See the README for the semantics and the bound table.
"""

from .api import (
    cross_entropy,
    cross_entropy_backward,
    cross_entropy_with_grad,
    log_softmax,
    logsumexp,
    softmax,
)
from .api_binary import (
    binary_cross_entropy,
    binary_cross_entropy_backward,
    binary_cross_entropy_with_grad,
    binary_cross_entropy_with_logits,
    binary_cross_entropy_with_logits_backward,
    binary_cross_entropy_with_logits_with_grad,
    cross_entropy_from_probs,
    cross_entropy_from_probs_backward,
    cross_entropy_from_probs_with_grad,
    sigmoid_focal_loss,
    sigmoid_focal_loss_backward,
    sigmoid_focal_loss_with_grad,
)
from ._config import show_config, openmp_enabled

__version__ = "0.1.0"

__all__ = [
    "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_with_grad",
    "log_softmax",
    "logsumexp",
    "softmax",
    "binary_cross_entropy_with_logits",
    "binary_cross_entropy_with_logits_backward",
    "binary_cross_entropy_with_logits_with_grad",
    "sigmoid_focal_loss",
    "sigmoid_focal_loss_backward",
    "sigmoid_focal_loss_with_grad",
    "binary_cross_entropy",
    "binary_cross_entropy_backward",
    "binary_cross_entropy_with_grad",
    "cross_entropy_from_probs",
    "cross_entropy_from_probs_backward",
    "cross_entropy_from_probs_with_grad",
    "show_config",
    "openmp_enabled",
    "__version__",
]
