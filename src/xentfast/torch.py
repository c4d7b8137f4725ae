"""PyTorch drop-ins: ``xentfast.torch.cross_entropy`` where you had ``torch.nn.functional.cross_entropy``.

Design
(a) Real custom ops (``torch.library.custom_op`` + ``register_fake`` + ``register_autograd``), not an
    ``autograd.Function``: Dynamo cannot trace into a Cython call, so a Function breaks the graph and
    ``torch.compile(fullgraph=True)`` fails; an op is an opaque node that compile and ``torch.export``
    keep whole.  Each loss is two pairs of ops, ``xentfast::<loss>_fwd`` / ``_bwd`` (unreduced losses;
    the input's gradient for a per-row upstream gradient) and ``_fwd_reduced`` / ``_bwd_reduced`` ('mean'
    and 'sum'; the gradient for a 0-d upstream gradient), generated from one table (:data:`_LOSSES`) by
    one mechanism.
(b) The ops call xentfast's public NumPy (or CuPy) functions: ``<loss>_fwd`` / ``<loss>_bwd`` with
    ``reduction="none"``, ``<loss>_fwd_reduced`` / ``<loss>_bwd_reduced`` with the call's 'mean' or
    'sum' and ``empty_mean`` (two more string arguments in their schemas).  The backward ops call
    ``<loss>_backward(grad, ...)`` with the per-row upstream gradient or the 0-d one, so the gradient is
    xentfast's own, bit for bit, with its documented bound plus one rounding of the upstream factor;
    saving the fused gradient and multiplying it afterwards would round twice.  Forward saves its inputs
    only (logits, target, weights: tensors the graph holds anyway), no N x C buffer and no per-row
    logsumexp: xentfast's backward takes none and rebuilds the row statistics in its own pass.
(c) Reductions happen inside the reduced ops, not as torch ops on the rows: rows rounded to the dtype
    first lose what the NumPy API's reductions keep (a sum of subnormal weighted rows; a weighted row
    past the dtype's range in a finite mean), and autograd would hand each row ``grad / denominator``
    rounded to the dtype, which overflows for a weight sum below 1 and underflows before a weight or
    ``1/p`` magnifies it.  So 'mean' and 'sum' are the NumPy API's: torch's denominators, the
    compensated sum, its 4 ULP bound, and subnormals never flushed whatever
    ``torch.set_flush_denormal`` says.  For CUDA tensors both reduced ops read a scalar back to the host
    (the reduction's compensated sum; the backward's 0-d upstream gradient), as the validation already
    reads its flags back.
(d) Tensors reach NumPy without copies: ``t.detach().numpy()`` is a view, strided or not (xentfast
    copies only where its kernels need a row-contiguous layout), and results come back through
    ``torch.from_numpy``.  bfloat16 has no NumPy buffer format: it travels as int16 bits viewed as
    ``ml_dtypes.bfloat16``.  Half inputs follow the NumPy API: widened exactly to float64 there (a
    float64 copy of the logits per op call), float32 losses, which the reductions keep (torch's own
    returns a bfloat16 loss, spaced 0.0625 near 10), and a gradient in the input's dtype, rounded once.
(e) CUDA tensors go to the CuPy kernels through DLPack, inside a context that makes torch's current
    stream CuPy's current stream and routes CuPy's allocations to torch's caching allocator, so
    outputs and temporaries are torch's memory, ordered on torch's stream.  xentfast's GPU validation
    reads its flags back once per call (xentfast._backend (b)); the ops are tagged
    ``cudagraph_unsafe`` so that a CUDA graph is never captured across that read or a first-use NVRTC
    compile.
(f) Limits.  Double backward is not provided: the backward ops have no derivative of their own, and
    their registered one raises a RuntimeError naming the drop-in.
    Forward-mode AD is not either: torch itself would return zero tangents through these ops for
    ``torch.func.jvp``, ``jacfwd`` and ``torch.autograd.forward_ad``, so the drop-ins raise a
    RuntimeError for a dual tensor or an input under a torch.func gradient transform (``grad``, ``vjp``,
    ``jacrev``, per-sample gradients ``vmap(grad(...))``, which torch would fail with an error about
    ``setup_context``).  Use reverse mode: ``backward()``, ``torch.autograd.grad``,
    ``torch.autograd.functional.jacobian``.  ``torch.func.vmap`` of the loss alone works, one example at
    a time, with torch's warning about a missing batching rule.
    Result dtypes: a float64 target with float32 logits gives a float32 loss (the target is cast to the
    logits' dtype, as in the NumPy API); torch promotes to float64.
"""

import contextlib
import math

import numpy as np
import torch

from . import api as _api
from . import api_binary as _api_binary

__all__ = [
    "cross_entropy",
    "binary_cross_entropy_with_logits",
    "sigmoid_focal_loss",
    "binary_cross_entropy",
    "cross_entropy_from_probs",
    "CrossEntropyLoss",
    "BCEWithLogitsLoss",
]

_REDUCTIONS = ("none", "mean", "sum")
_EMPTY_MEAN = ("nan", "zero")
_HALF = (torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------------------------------
# tensors <-> arrays


def _to_numpy(t):
    if t is None:
        return None
    t = t.detach()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _from_array(a, xp):
    """A torch tensor over array `a`'s memory (NumPy or CuPy), bfloat16 through its int16 bits."""
    a = xp.asarray(a)
    bf16 = a.dtype.name == "bfloat16"
    if bf16:
        a = a.view(np.int16)
    t = torch.from_numpy(a) if xp is np else torch.from_dlpack(a)
    return t.view(torch.bfloat16) if bf16 else t


def _loss_dtype(dtype):
    return torch.float32 if dtype in _HALF else dtype


# ---------------------------------------------------------------------------------------------------
# the table of losses and the ops generated from it


class _Loss:
    """One loss: its NumPy-level forward and backward, the optional tensors and scalar options its ops
    take (schema types), and whether it has a class axis (torch's: dimension 1, or 0 unbatched)."""

    def __init__(self, name, forward, backward, tensors, options, class_axis):
        self.name = name
        self.forward = forward
        self.backward = backward
        self.tensors = tensors
        self.options = options
        self.class_axis = class_axis

    def schema_args(self):
        return ", ".join(["Tensor input", "Tensor target"] + [f"Tensor? {n}" for n in self.tensors]
                         + [f"{ty} {n}" for n, ty in self.options])

    def loss_shape(self, shape):
        if not self.class_axis:
            return tuple(shape)
        axis = 1 if len(shape) >= 2 else 0
        return tuple(shape[:axis]) + tuple(shape[axis + 1:])

    def kwargs(self, input, rest):
        """NumPy keyword arguments from an op's trailing arguments (optional tensors, then options)."""
        nt = len(self.tensors)
        kw = dict(zip(self.tensors, rest[:nt]))
        kw.update(zip((n for n, _ in self.options), rest[nt:]))
        if self.class_axis:
            kw["axis"] = 1 if input.ndim >= 2 else 0
        return kw


_NAN = ("nan_policy", "str")
_LOSSES = {
    loss.name: loss for loss in (
        _Loss("cross_entropy", _api.cross_entropy, _api.cross_entropy_backward, ("weight",),
              (("ignore_index", "int"), ("label_smoothing", "float"), ("z_loss", "float"), _NAN), True),
        _Loss("cross_entropy_from_probs", _api_binary.cross_entropy_from_probs,
              _api_binary.cross_entropy_from_probs_backward, ("weight",),
              (("ignore_index", "int"), ("eps", "float?"), _NAN), True),
        _Loss("binary_cross_entropy_with_logits", _api_binary.binary_cross_entropy_with_logits,
              _api_binary.binary_cross_entropy_with_logits_backward, ("weight", "pos_weight"),
              (("ignore_index", "float?"), _NAN), False),
        _Loss("sigmoid_focal_loss", _api_binary.sigmoid_focal_loss, _api_binary.sigmoid_focal_loss_backward, (),
              (("alpha", "float"), ("gamma", "float"), ("ignore_index", "float?"), _NAN), False),
        _Loss("binary_cross_entropy", _api_binary.binary_cross_entropy, _api_binary.binary_cross_entropy_backward,
              ("weight",), (("eps", "float?"), ("log_clamp", "float?"), _NAN), False),
    )
}


def _reduction_kw(rest, reduced):
    """(the op's loss arguments, the NumPy API's reduction keywords): a reduced op's schema ends with
    reduction and empty_mean."""
    if not reduced:
        return rest, {"reduction": "none"}
    *rest, reduction, empty_mean = rest
    return rest, {"reduction": reduction, "empty_mean": empty_mean}


def _run_cpu(fn, loss, arrays_first, input, target, rest, reduced):
    rest, red = _reduction_kw(rest, reduced)
    nt = len(loss.tensors)
    kw = loss.kwargs(input, [_to_numpy(t) for t in rest[:nt]] + list(rest[nt:]))
    # torch.set_num_threads governs xentfast's threads too; results do not depend on the count
    out = fn(*[_to_numpy(t) for t in arrays_first], _to_numpy(input), _to_numpy(target),
             n_threads=torch.get_num_threads(), **red, **kw)
    return _from_array(out, np)


def _run_cuda(fn, loss, arrays_first, input, target, rest, reduced):
    import cupy
    rest, red = _reduction_kw(rest, reduced)
    nt = len(loss.tensors)
    with _on_torch_stream(cupy, input.device):
        kw = loss.kwargs(input, [_to_cupy(cupy, t) for t in rest[:nt]] + list(rest[nt:]))
        out = fn(*[_to_cupy(cupy, t) for t in arrays_first], _to_cupy(cupy, input), _to_cupy(cupy, target),
                 **red, **kw)
        return _from_array(out, cupy)


def _tags():
    """custom_op's tags argument, where this torch has both it and the cudagraph_unsafe tag (older
    releases lack one or the other; there, leave inductor's CUDA graphs off around these ops)."""
    import inspect
    if "tags" in inspect.signature(torch.library.custom_op).parameters and hasattr(torch.Tag, "cudagraph_unsafe"):
        return {"tags": (torch.Tag.cudagraph_unsafe,)}
    return {}


def _make_ops(loss, reduced):
    """The op pair of one loss: unreduced (``<loss>_fwd``: the per-row losses; ``<loss>_bwd``: the input's
    gradient for per-row upstream values), or reduced (``<loss>_fwd_reduced``: the NumPy API's 'mean' or
    'sum', a 0-d tensor; ``<loss>_bwd_reduced``: its gradient for a 0-d upstream value)."""
    ns = f"xentfast::{loss.name}"
    suffix, more = ("_reduced", ", str reduction, str empty_mean") if reduced else ("", "")
    n_args = 2 + len(loss.tensors) + len(loss.options) + (2 if reduced else 0)
    extra = _tags()
    fwd = torch.library.custom_op(f"{ns}_fwd{suffix}", mutates_args=(), device_types="cpu", **extra,
                                  schema=f"({loss.schema_args()}{more}) -> Tensor")(
        lambda input, target, *rest: _run_cpu(loss.forward, loss, (), input, target, rest, reduced))
    bwd = torch.library.custom_op(f"{ns}_bwd{suffix}", mutates_args=(), device_types="cpu", **extra,
                                  schema=f"(Tensor grad, {loss.schema_args()}{more}) -> Tensor")(
        lambda grad, input, target, *rest: _run_cpu(loss.backward, loss, (grad,), input, target, rest, reduced))
    fwd.register_kernel("cuda")(
        lambda input, target, *rest: _run_cuda(loss.forward, loss, (), input, target, rest, reduced))
    bwd.register_kernel("cuda")(
        lambda grad, input, target, *rest: _run_cuda(loss.backward, loss, (grad,), input, target, rest, reduced))

    @fwd.register_fake
    def _(input, target, *rest):
        shape = () if reduced else loss.loss_shape(input.shape)
        return input.new_empty(shape, dtype=_loss_dtype(input.dtype))

    @bwd.register_fake
    def _(grad, input, target, *rest):
        return input.new_empty(input.shape)

    nt = len(loss.tensors)

    def setup_context(ctx, inputs, output):
        # without this, an unused output's gradient would arrive as a dense zeros tensor
        ctx.set_materialize_grads(False)
        input, target, *rest = inputs
        ctx.save_for_backward(input, target, *rest[:nt])
        ctx.options = tuple(rest[nt:])

    def backward(ctx, grad):
        if grad is None:
            return (None,) * n_args
        input, target, *tensors = ctx.saved_tensors
        dinput = bwd(grad, input, target, *tensors, *ctx.options) if ctx.needs_input_grad[0] else None
        return (dinput,) + (None,) * (n_args - 1)

    fwd.register_autograd(backward, setup_context=setup_context)

    def no_second_derivative(ctx, grad):
        # without it torch's message names the op and asks the caller to register a formula
        raise RuntimeError(f"xentfast.torch.{loss.name}: no second derivative (double backward, "
                           f"create_graph=True then another backward): the gradient is a kernel call without "
                           f"a derivative of its own; use torch.nn.functional where higher derivatives are "
                           f"needed")

    bwd.register_autograd(no_second_derivative, setup_context=lambda ctx, inputs, output: None)
    return fwd, bwd


_OPS = {name: _make_ops(loss, False) for name, loss in _LOSSES.items()}
_REDUCED_OPS = {name: _make_ops(loss, True) for name, loss in _LOSSES.items()}


def _call(name, reduction, empty_mean, input, target, *rest):
    """The loss through its unreduced ops ('none') or its reduced ones ('mean', 'sum')."""
    if reduction == "none":
        return _OPS[name][0](input, target, *rest)
    return _REDUCED_OPS[name][0](input, target, *rest, reduction, empty_mean)


# ---------------------------------------------------------------------------------------------------
# CUDA: CuPy on torch's stream, with torch's allocator


@contextlib.contextmanager
def _on_torch_stream(cupy, device):
    """`device` current for CuPy, torch's current stream CuPy's current stream, and torch's caching
    allocator CuPy's allocator, for the duration of one op call."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(index)
    with contextlib.ExitStack() as stack:
        stack.enter_context(cupy.cuda.Device(index))
        if hasattr(cupy.cuda.Stream, "from_external"):      # CuPy >= 14, where ExternalStream is deprecated
            stack.enter_context(cupy.cuda.Stream.from_external(stream))
        else:
            stack.enter_context(cupy.cuda.ExternalStream(stream.cuda_stream, index))
        stack.enter_context(cupy.cuda.using_allocator(_torch_allocator(cupy)))
        yield


_allocator = None


def _torch_allocator(cupy):
    """CuPy allocations from torch's caching allocator, on torch's current stream (the one the op runs
    on): memory torch can see, reuse and order, never CuPy's pool handed over behind torch's back."""
    global _allocator
    if _allocator is None:
        def malloc(size, device_id):
            return torch.cuda.caching_allocator_alloc(size, device_id)

        def free(ptr, device_id):
            torch.cuda.caching_allocator_delete(ptr)

        _allocator = cupy.cuda.memory.PythonFunctionAllocator(malloc, free).malloc
    return _allocator


def _to_cupy(cupy, t):
    if t is None:
        return None
    t = t.detach()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return cupy.from_dlpack(t.view(torch.int16)).view(ml_dtypes.bfloat16)
    return cupy.from_dlpack(t)


# ---------------------------------------------------------------------------------------------------
# argument checks


def _check_legacy(size_average, reduce):
    if size_average is not None or reduce is not None:
        raise ValueError("size_average and reduce: torch's deprecated arguments are not supported; "
                         "pass reduction='none', 'mean' or 'sum'")


def _check_choice(value, choices, name):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(repr(c) for c in choices)}; got {value!r}")


def _check_no_grad(**tensors):
    # only while autograd records: under torch.no_grad() (an evaluation loop with a learnable class
    # weight, say) no gradient is asked of anything, and torch computes the loss
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise NotImplementedError(
                f"{name}: xentfast differentiates with respect to the input only; {name} requires grad "
                f"(pass {name}.detach() if no gradient is wanted for it)")


def _refuse_unsupported_differentiation(input):
    """Forward-mode AD and functorch's gradient transforms, refused up front: through these ops torch
    returns zero tangents for jvp / jacfwd / forward_ad without a word, and grad / vjp / jacrev fail
    with an error about setup_context (see (f)).  Not under torch.compile, which traces neither."""
    if torch.compiler.is_compiling():
        return
    if torch._C._functorch.is_gradtrackingtensor(input):
        raise RuntimeError("input: xentfast.torch's ops support no torch.func transform but vmap (grad, vjp, "
                           "jvp, jacrev, jacfwd); use torch.autograd (loss.backward(), "
                           "torch.autograd.grad, torch.autograd.functional.jacobian)")
    if torch.autograd.forward_ad._current_level >= 0 and \
            torch.autograd.forward_ad.unpack_dual(input).tangent is not None:
        raise RuntimeError("input: a forward-mode dual tensor; xentfast.torch's ops have no forward-mode "
                           "derivative (torch would return zero tangents); use reverse mode")


def _check_tensors(**tensors):
    """The arguments that torch.nn.functional takes as tensors only (input and target): anything else
    failed deep inside torch or this module (an AttributeError for a list, a device message comparing
    cpu with cpu for a NumPy array), naming neither."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            kind = type(t).__name__ if type(t).__module__ == "builtins" else f"{type(t).__module__}.{type(t).__name__}"
            raise TypeError(f"{name}: expected a torch.Tensor, got {kind} (xentfast's NumPy functions take "
                            f"arrays)")


def _check_devices(input, **tensors):
    """Every tensor argument on the input's device.  A meta tensor among CPU ones would otherwise send the
    call to the shape-only fake kernels, which return uninitialised memory as the loss."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.device != input.device:
            raise ValueError(f"{name}: on device {t.device}, expected the input's device {input.device}")


def _check_float(value, name):
    """A float argument for an op: strings and bools refused (float() would read "0.1" and True), then
    float(), which torch.compile traces (a symbolic float specializes); the range and finiteness checks
    are the NumPy API's, inside the op, where Dynamo does not trace (math.isfinite of a symbolic float
    breaks the graph)."""
    # a 0-d boolean tensor or array too: float() reads True as 1 (full label smoothing, say).  isinstance
    # first: Dynamo cannot trace getattr on the symbolic float that a changing option becomes
    if isinstance(value, (str, bytes, bool, np.bool_)) or value is None or \
            (isinstance(value, torch.Tensor) and value.dtype == torch.bool) or \
            (isinstance(value, np.ndarray) and value.dtype == np.bool_):
        raise TypeError(f"{name}: expected a real number, got {value!r}")
    try:
        return float(value)
    except OverflowError:
        return math.inf  # an int beyond float64: the op's check then says it must be finite, naming it
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name}: expected a real number, got {value!r}") from None


def _as_tensor(value, like, name):
    """Array-like weights as tensors on the input's device (None stays None)."""
    if value is None or isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(value, device=like.device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"{name}: expected a tensor or an array of real numbers, got {value!r} ({e})") from None


# ---------------------------------------------------------------------------------------------------
# functions

def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0, *, z_loss=0.0, empty_mean="nan",
                  nan_policy="propagate"):
    """``torch.nn.functional.cross_entropy`` with xentfast's forward and backward.

    Same arguments (``size_average`` and ``reduce``, deprecated in torch, must be None), plus
    ``z_loss``, ``empty_mean`` and ``nan_policy`` as in :func:`xentfast.cross_entropy`.  ``input`` is
    ``(N, C)``, ``(N, C, d1, ...)`` or ``(C,)``; ``target`` holds class indices (any integer dtype) or
    class probabilities of ``input``'s shape.  Differentiable with respect to ``input`` only.

    Error bound: per-row losses (``reduction='none'``) and the gradient as :func:`xentfast.cross_entropy`
    and :func:`xentfast.cross_entropy_backward` (the gradient with one more ULP for the upstream factor);
    'mean' and 'sum' as the NumPy API's, module docstring (c).
    """
    _check_tensors(input=input, target=target)
    _check_legacy(size_average, reduce)
    _check_choice(reduction, _REDUCTIONS, "reduction")
    _check_choice(empty_mean, _EMPTY_MEAN, "empty_mean")
    weight = _as_tensor(weight, input, "weight")
    _check_no_grad(target=target, weight=weight)
    _check_devices(input, target=target, weight=weight)
    _refuse_unsupported_differentiation(input)
    # an int, as torch takes it (the op's schema would truncate 1.5 silently), within int64 (the schema
    # would refuse a larger one with a message naming no argument)
    ignore_index = _api._check_ignore_index(ignore_index)
    return _call("cross_entropy", reduction, empty_mean, input, target, weight, ignore_index,
                 _check_float(label_smoothing, "label_smoothing"), _check_float(z_loss, "z_loss"), nan_policy)


def cross_entropy_from_probs(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                             reduction="mean", *, eps=None, empty_mean="nan", nan_policy="propagate"):
    """torch's ``nll_loss(input.log(), target, ...)`` computed from the probabilities ``input`` directly.

    ``nll_loss``'s arguments, with probabilities in place of log-probabilities, plus ``eps`` (Keras's
    clip), ``empty_mean`` and ``nan_policy`` as in :func:`xentfast.cross_entropy_from_probs`.  Index or
    probability targets; ``input`` is ``(N, C)``, ``(N, C, d1, ...)`` or ``(C,)``.  If you have logits,
    call :func:`cross_entropy`.

    Error bound: per-row losses (``reduction='none'``) and the gradient as
    :func:`xentfast.cross_entropy_from_probs` and its backward (the gradient with one more ULP for the
    upstream factor); 'mean' and 'sum' as the NumPy API's, module docstring (c).
    """
    _check_tensors(input=input, target=target)
    _check_legacy(size_average, reduce)
    _check_choice(reduction, _REDUCTIONS, "reduction")
    _check_choice(empty_mean, _EMPTY_MEAN, "empty_mean")
    weight = _as_tensor(weight, input, "weight")
    _check_no_grad(target=target, weight=weight)
    _check_devices(input, target=target, weight=weight)
    _refuse_unsupported_differentiation(input)
    # an int, as torch takes it (the op's schema would truncate 1.5 silently), within int64 (the schema
    # would refuse a larger one with a message naming no argument)
    ignore_index = _api._check_ignore_index(ignore_index)
    return _call("cross_entropy_from_probs", reduction, empty_mean, input, target, weight, ignore_index,
                 None if eps is None else _check_float(eps, "eps"), nan_policy)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None, *, ignore_index=None, empty_mean="nan",
                                     nan_policy="propagate"):
    """``torch.nn.functional.binary_cross_entropy_with_logits`` with xentfast's forward and backward.

    Same arguments (``size_average``/``reduce`` must be None), plus ``ignore_index``, ``empty_mean`` and
    ``nan_policy`` as in :func:`xentfast.binary_cross_entropy_with_logits`.  Targets must lie in [0, 1];
    ``weight`` and ``pos_weight`` broadcast to the input (must be >= 0).  'mean' divides by the number of
    elements (those not ignored).  Differentiable with respect to ``input`` only.

    Error bound: per-element losses (``reduction='none'``) and the gradient as
    :func:`xentfast.binary_cross_entropy_with_logits` and its backward (the gradient with one more ULP
    for the upstream factor); 'mean' and 'sum' as the NumPy API's, module docstring (c).
    """
    _check_tensors(input=input, target=target)
    _check_legacy(size_average, reduce)
    _check_choice(reduction, _REDUCTIONS, "reduction")
    _check_choice(empty_mean, _EMPTY_MEAN, "empty_mean")
    weight, pos_weight = _as_tensor(weight, input, "weight"), _as_tensor(pos_weight, input, "pos_weight")
    _check_no_grad(target=target, weight=weight, pos_weight=pos_weight)
    _check_devices(input, target=target, weight=weight, pos_weight=pos_weight)
    _refuse_unsupported_differentiation(input)
    ignore = None if ignore_index is None else _check_float(ignore_index, "ignore_index")
    return _call("binary_cross_entropy_with_logits", reduction, empty_mean, input, target, weight, pos_weight,
                 ignore, nan_policy)


def sigmoid_focal_loss(inputs, targets, alpha=0.25, gamma=2.0, reduction="none", *, ignore_index=None,
                       empty_mean="nan", nan_policy="propagate"):
    """``torchvision.ops.sigmoid_focal_loss`` with xentfast's forward and backward.

    torchvision's arguments (``reduction='none'`` by default), plus ``ignore_index``, ``empty_mean`` and
    ``nan_policy`` as in :func:`xentfast.sigmoid_focal_loss`.  ``alpha`` must be <= 1 (negative: no
    weighting).  Differentiable with respect to ``inputs`` only.

    Error bound: per-element losses (``reduction='none'``) and the gradient as
    :func:`xentfast.sigmoid_focal_loss` and its backward (the gradient with one more ULP for the upstream
    factor); 'mean' and 'sum' as the NumPy API's, module docstring (c).
    """
    _check_tensors(inputs=inputs, targets=targets)
    _check_choice(reduction, _REDUCTIONS, "reduction")
    _check_choice(empty_mean, _EMPTY_MEAN, "empty_mean")
    _check_no_grad(targets=targets)
    _check_devices(inputs, targets=targets)
    _refuse_unsupported_differentiation(inputs)
    ignore = None if ignore_index is None else _check_float(ignore_index, "ignore_index")
    return _call("sigmoid_focal_loss", reduction, empty_mean, inputs, targets, _check_float(alpha, "alpha"),
                 _check_float(gamma, "gamma"), ignore, nan_policy)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean", *,
                         eps=None, log_clamp=None, empty_mean="nan", nan_policy="propagate"):
    """``torch.nn.functional.binary_cross_entropy`` (probabilities in) with xentfast's forward and backward.

    Same arguments (``size_average``/``reduce`` must be None), plus ``eps``, ``log_clamp``,
    ``empty_mean`` and ``nan_policy`` as in :func:`xentfast.binary_cross_entropy`.  By default the log
    is not clamped (``-log 0 = inf``); ``log_clamp=-100.0`` gives torch's forward values, with the
    gradient of that clamped function.  If you have logits, call :func:`binary_cross_entropy_with_logits`.

    Error bound: per-element losses (``reduction='none'``) and the gradient as
    :func:`xentfast.binary_cross_entropy` and its backward (the gradient with one more ULP for the
    upstream factor); 'mean' and 'sum' as the NumPy API's, module docstring (c).
    """
    _check_tensors(input=input, target=target)
    _check_legacy(size_average, reduce)
    _check_choice(reduction, _REDUCTIONS, "reduction")
    _check_choice(empty_mean, _EMPTY_MEAN, "empty_mean")
    weight = _as_tensor(weight, input, "weight")
    _check_no_grad(target=target, weight=weight)
    _check_devices(input, target=target, weight=weight)
    _refuse_unsupported_differentiation(input)
    # float(False) would be a clamp of 0 (every loss and gradient 0)
    return _call("binary_cross_entropy", reduction, empty_mean, input, target, weight,
                 None if eps is None else _check_float(eps, "eps"),
                 None if log_clamp is None else _check_float(log_clamp, "log_clamp"), nan_policy)


# ---------------------------------------------------------------------------------------------------
# modules


class CrossEntropyLoss(torch.nn.Module):
    """``torch.nn.CrossEntropyLoss`` with xentfast's forward and backward (see :func:`cross_entropy`).

    Same constructor arguments, plus ``z_loss``, ``empty_mean`` and ``nan_policy``; ``weight`` is a
    buffer named as torch names it, so state dicts load either way.
    """

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                 label_smoothing=0.0, *, z_loss=0.0, empty_mean="nan", nan_policy="propagate"):
        super().__init__()
        _check_legacy(size_average, reduce)
        _check_choice(reduction, _REDUCTIONS, "reduction")
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.empty_mean = empty_mean
        self.nan_policy = nan_policy

    def forward(self, input, target):
        return cross_entropy(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction,
                             label_smoothing=self.label_smoothing, z_loss=self.z_loss, empty_mean=self.empty_mean,
                             nan_policy=self.nan_policy)


class BCEWithLogitsLoss(torch.nn.Module):
    """``torch.nn.BCEWithLogitsLoss`` with xentfast's forward and backward (see
    :func:`binary_cross_entropy_with_logits`).

    Same constructor arguments, plus ``ignore_index``, ``empty_mean`` and ``nan_policy``; ``weight`` and
    ``pos_weight`` are buffers named as torch names them.
    """

    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None, *,
                 ignore_index=None, empty_mean="nan", nan_policy="propagate"):
        super().__init__()
        _check_legacy(size_average, reduce)
        _check_choice(reduction, _REDUCTIONS, "reduction")
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)
        self.reduction = reduction
        self.ignore_index = ignore_index
        self.empty_mean = empty_mean
        self.nan_policy = nan_policy

    def forward(self, input, target):
        return binary_cross_entropy_with_logits(input, target, self.weight, reduction=self.reduction,
                                                pos_weight=self.pos_weight, ignore_index=self.ignore_index,
                                                empty_mean=self.empty_mean, nan_policy=self.nan_policy)
