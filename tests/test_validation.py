"""Bad input raises a clear exception naming the argument, before any kernel runs; edge shapes work."""
import re

import numpy as np
import pytest

import xentfast as xf

X = np.arange(12, dtype=np.float64).reshape(3, 4) / 7.0
Y = np.array([0, 3, 1])


def raises(exc, *words):
    """pytest.raises whose message must contain every word (argument name, offending value)."""
    return pytest.raises(exc, match=".*".join(re.escape(w) for w in words))


XENT_FUNCS = [
    pytest.param(lambda *a, **k: xf.cross_entropy(*a, **k), id="forward"),
    pytest.param(lambda *a, **k: xf.cross_entropy_backward(1.0 if k.get("reduction", "mean") != "none"
                                                           else np.ones(np.shape(a[1]) if np.ndim(a[1]) else ()),
                                                           *a, **k), id="backward"),
    pytest.param(lambda *a, **k: xf.cross_entropy_with_grad(*a, **k), id="fused"),
]


@pytest.mark.parametrize("f", XENT_FUNCS)
class TestCrossEntropyArguments:
    def test_integer_logits(self, f):
        with raises(TypeError, "input", "int64", "floating point"):
            f(np.arange(12).reshape(3, 4), Y)

    def test_complex_logits(self, f):
        # float16 was refused here until half precision became supported (tests/test_half_and_dlpack.py)
        with raises(TypeError, "input", "complex64", "must be real"):
            f(X.astype(np.complex64), Y)

    def test_zero_dim_input(self, f):
        with raises(ValueError, "input", "0-d"):
            f(np.float64(1.0), np.int64(0))

    def test_axis_out_of_range(self, f):
        with raises(ValueError, "axis", "out of range"):
            f(X, Y, axis=2)

    def test_target_wrong_shape(self, f):
        with raises(ValueError, "target", "(3,)", "(2,)"):
            f(X, np.array([0, 1]))

    def test_float_target_with_index_shape(self, f):
        with raises(TypeError, "target", "integer dtype"):
            f(X, Y.astype(np.float64))

    def test_bool_target(self, f):
        with raises(TypeError, "target", "boolean"):
            f(X, np.array([True, False, True]))

    def test_integer_target_of_the_input_shape(self, f):
        # one-hot rows as integers: probabilities must be floating point (torch says so too)
        with raises(TypeError, "target", "integer values of the input's shape (3, 4)", "float dtype"):
            f(X, np.eye(4, dtype=np.int64)[Y])

    def test_target_in_torch_layout_without_axis(self, f):
        x = np.zeros((2, 4, 3))
        with raises(ValueError, "target", "(2, 4)", "got shape (2, 3)", "pass axis=1"):
            f(x, np.zeros((2, 3), dtype=np.int64))

    @pytest.mark.parametrize("bad, where", [(4, "[1]"), (-1, "[1]"), (-101, "[1]")])
    def test_label_out_of_range(self, f, bad, where):
        y = Y.copy()
        y[1] = bad
        with raises(ValueError, "target", "[0, 4)", "ignore_index=-100", f"found {bad} at index {where}"):
            f(X, y)

    def test_label_out_of_range_nd_reports_multi_index(self, f):
        x = np.zeros((2, 4, 3))
        y = np.zeros((2, 3), dtype=np.int32)
        y[1, 2] = 9
        with raises(ValueError, "found 9 at index [1, 2]"):
            f(x, y, axis=1)

    def test_huge_unsigned_label_does_not_wrap(self, f):
        y = np.array([0, 2**63 + 1, 1], dtype=np.uint64)
        with raises(ValueError, "target", "found 9223372036854775809"):
            f(X, y)

    @pytest.mark.parametrize("bad", [2**63, 2**64, -2**63 - 1])
    def test_python_int_label_beyond_int64_is_named(self, f, bad):
        # NumPy makes such a list float64 (2**63 beside small ints) or object: the label is the error,
        # not "floating-point values"
        with raises(ValueError, "target", "[0, 4)", f"found {bad} at index [1]"):
            f(X, [0, bad, 1])

    @pytest.mark.parametrize("tdtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32])
    def test_first_bad_label_among_ignored_rows(self, f, tdtype):
        # ignored rows before and after it; the labels are checked once, after a cast to int64 that
        # keeps every value of these dtypes
        ii = -100 if np.dtype(tdtype).kind == "i" else 200
        y = np.array([ii, 1, 7, ii, 9], dtype=tdtype)
        with raises(ValueError, "target", "[0, 4)", f"ignore_index={ii}", "found 7 at index [2]"):
            f(np.zeros((5, 4)), y, ignore_index=ii)

    def test_label_that_wraps_onto_ignore_index_is_still_bad(self, f):
        # 156 is -100 modulo 256: a uint8 label compared after a wrapping cast would pass as ignored
        with raises(ValueError, "found 156 at index [1]"):
            f(X, np.array([0, 156, 1], dtype=np.uint8))

    def test_ignore_index_inside_the_class_range(self, f):
        with raises(ValueError, "ignore_index=2", "found 4 at index [2]"):
            f(X, np.array([2, 2, 4]), ignore_index=2)

    def test_weight_wrong_length(self, f):
        with raises(ValueError, "weight", "(4,)", "(3,)"):
            f(X, Y, weight=np.ones(3))

    @pytest.mark.parametrize("bad", [np.nan, -1.0, np.inf])
    def test_weight_bad_values(self, f, bad):
        w = np.ones(4)
        w[2] = bad
        with raises(ValueError, "weight", "at index 2"):
            f(X, Y, weight=w)

    def test_mean_whose_weight_sum_overflows(self, f):
        # each row's share w_y / sum(w_y) would round to 0: a NaN mean and a zero gradient
        with raises(ValueError, "weight", "denominator", "overflows"):
            f(X, Y, weight=np.full(4, 1e308))
        f(X, Y, weight=np.full(4, 1e308), reduction="none")

    def test_unknown_reduction(self, f):
        with raises(ValueError, "reduction", "'avg'"):
            f(X, Y, reduction="avg")

    @pytest.mark.parametrize("eps", [-0.1, 1.5, np.nan, 2.0**-901, 5e-324])
    def test_label_smoothing_out_of_range(self, f, eps):
        with raises(ValueError, "label_smoothing"):
            f(X, Y, label_smoothing=eps)

    def test_smallest_label_smoothing_is_accepted(self, f):
        f(X, Y, label_smoothing=2.0**-900)

    def test_negative_z_loss(self, f):
        with raises(ValueError, "z_loss"):
            f(X, Y, z_loss=-1.0)

    def test_unknown_empty_mean(self, f):
        with raises(ValueError, "empty_mean"):
            f(X, Y, empty_mean="raise-please")

    def test_nan_policy_raise_names_row_and_class(self, f):
        x = X.copy()
        x[2, 1] = np.nan
        with raises(ValueError, "input", "NaN", "row [2]", "class 1"):
            f(x, Y, nan_policy="raise")

    def test_zero_threads(self, f):
        with raises(ValueError, "n_threads"):
            f(X, Y, n_threads=0)

    def test_empty_class_axis(self, f):
        with raises(ValueError, "class axis", "length 0"):
            f(np.zeros((3, 0)), Y * 0)

    def test_probability_target_wrong_shape(self, f):
        with raises(ValueError, "target", "(3, 4)"):
            f(X, np.ones((3, 5)) / 5)

    @pytest.mark.parametrize("ignore", [0, 3, 7])
    def test_ignore_index_with_probability_targets(self, f, ignore):
        # torch raises too: a class number would let the caller think that class's rows were dropped
        with raises(ValueError, "ignore_index", f"={ignore}", "probability targets"):
            f(X, np.ones((3, 4)) / 4, ignore_index=ignore)

    @pytest.mark.parametrize("ignore", [-1, -5])
    def test_negative_ignore_index_with_probability_targets_changes_nothing(self, f, ignore):
        # torch accepts a negative value there (no label can equal it), CrossEntropyLoss(ignore_index=-1)
        # with soft targets included; the results are those of the default
        t = np.array([[0.1, 0.2, 0.3, 0.4]] * 3)
        got = f(X, t, ignore_index=ignore)
        want = f(X, t)
        for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            np.testing.assert_array_equal(a, b)


def test_probs_ignore_index_with_probability_targets():
    p = np.full((3, 4), 0.25)
    with raises(ValueError, "ignore_index", "=2", "probability targets"):
        xf.cross_entropy_from_probs(p, p, ignore_index=2)


class TestGradArguments:
    def test_grad_output_wrong_shape_none(self):
        with raises(ValueError, "grad_output", "(3,)", "(4,)"):
            xf.cross_entropy_backward(np.ones(4), X, Y, reduction="none")

    def test_grad_output_integer_beyond_float64(self):
        with raises(ValueError, "grad_output", "float64's range"):
            xf.cross_entropy_backward(10**400, X, Y)
        with raises(ValueError, "grad_output", "float64's range"):
            xf.cross_entropy_backward(-10**5000, X, Y)   # more digits than str() of an int may print

    def test_grad_output_integer_beyond_int64_is_a_float(self):
        # NumPy holds 2**70 as an object; float64 holds it exactly
        got = xf.cross_entropy_backward(2**70, X, Y)
        assert got.tobytes() == xf.cross_entropy_backward(float(2**70), X, Y).tobytes()

    def test_grad_output_bool(self):
        with raises(TypeError, "grad_output", "bool"):
            xf.cross_entropy_backward(True, X, Y)

    def test_grad_output_not_scalar_for_mean(self):
        with raises(ValueError, "grad_output", "scalar"):
            xf.cross_entropy_backward(np.ones(3), X, Y, reduction="mean")

    @pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
    def test_grad_output_none_means_one_in_every_backward(self, reduction):
        # the docstrings' "None means 1 (every entry)", as the _with_grad functions' default
        rng = np.random.default_rng(5)
        x = rng.standard_normal((3, 4))
        p, t = 1 / (1 + np.exp(-x)), (rng.random((3, 4)) < 0.5).astype(float)
        ones = np.ones(3) if reduction == "none" else 1.0
        ones_elem = np.ones((3, 4)) if reduction == "none" else 1.0
        for backward, args, g1 in [(xf.cross_entropy_backward, (x, Y), ones),
                                   (xf.cross_entropy_from_probs_backward, (p, Y), ones),
                                   (xf.binary_cross_entropy_with_logits_backward, (x, t), ones_elem),
                                   (xf.sigmoid_focal_loss_backward, (x, t), ones_elem),
                                   (xf.binary_cross_entropy_backward, (p, t), ones_elem)]:
            got = backward(None, *args, reduction=reduction)
            assert np.array_equal(got, backward(g1, *args, reduction=reduction)), backward.__name__
            assert np.isfinite(got).all() and (got != 0).any(), backward.__name__

    def test_target_none_is_named(self):
        for loss, x in [(xf.cross_entropy, X), (xf.cross_entropy_from_probs, np.full((3, 4), 0.25)),
                        (xf.binary_cross_entropy_with_logits, X), (xf.binary_cross_entropy, np.full((3, 4), 0.5))]:
            with raises(TypeError, "target", "got None"):
                loss(x, None)

    def test_out_wrong_shape(self):
        with raises(ValueError, "out", "(3, 4)"):
            xf.cross_entropy_with_grad(X, Y, out=np.empty((4, 3)))

    def test_out_wrong_dtype(self):
        with raises(ValueError, "out", "float64", "float32"):
            xf.cross_entropy_with_grad(X, Y, out=np.empty((3, 4), dtype=np.float32))

    def test_out_byte_swapped_names_the_byte_order(self):
        swapped = ">f8" if np.little_endian else "<f8"
        with raises(ValueError, "out", "float64 in native byte order", f"dtype {swapped}"):
            xf.cross_entropy_with_grad(X, Y, out=np.empty((3, 4), dtype=swapped))

    def test_out_overlapping_input(self):
        x = X.copy()
        with raises(ValueError, "out", "overlaps input"):
            xf.cross_entropy_with_grad(x, Y, out=x)

    def test_out_read_only(self):
        out = np.empty((3, 4))
        out.flags.writeable = False
        with raises(ValueError, "out", "read-only"):
            xf.cross_entropy_with_grad(X, Y, out=out)

    def test_inplace_on_read_only(self):
        x = X.copy()
        x.flags.writeable = False
        with raises(ValueError, "input", "read-only"):
            xf.cross_entropy_with_grad(x, Y, inplace=True)

    def test_inplace_on_list(self):
        with raises(TypeError, "input", "inplace=True"):
            xf.cross_entropy_with_grad(X.tolist(), Y, inplace=True)

    def test_inplace_and_out(self):
        with raises(ValueError, "out", "inplace"):
            xf.cross_entropy_with_grad(X.copy(), Y, out=np.empty((3, 4)), inplace=True)


class TestSoftmaxFamilyArguments:
    @pytest.mark.parametrize("f", [xf.log_softmax, xf.softmax, xf.logsumexp])
    def test_integer_input(self, f):
        with raises(TypeError, "input", "int64"):
            f(np.arange(4))

    @pytest.mark.parametrize("f", [xf.log_softmax, xf.softmax, xf.logsumexp])
    def test_bad_axis(self, f):
        with raises(ValueError, "axis"):
            f(X, axis=-3)


class TestEdgeShapes:
    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_empty_batch(self, dtype):
        x = np.zeros((0, 5), dtype=dtype)
        y = np.zeros(0, dtype=np.int64)
        assert xf.cross_entropy(x, y, reduction="none").shape == (0,)
        assert xf.cross_entropy(x, y, reduction="sum") == 0
        assert np.isnan(xf.cross_entropy(x, y, reduction="mean"))
        assert xf.cross_entropy(x, y, reduction="mean", empty_mean="zero") == 0
        loss, g = xf.cross_entropy_with_grad(x, y)
        assert g.shape == (0, 5) and g.dtype == dtype
        assert xf.log_softmax(x).shape == (0, 5)
        assert xf.logsumexp(x).shape == (0,)

    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_single_class(self, dtype):
        # one class: probability 1, loss 0 and gradient 0 for any finite logit
        x = np.array([[3.5], [-1e30], [0.0]], dtype=dtype)
        loss, g = xf.cross_entropy_with_grad(x, np.zeros(3, dtype=np.int64), reduction="none")
        assert np.array_equal(loss, np.zeros(3, dtype=dtype))
        assert np.array_equal(g, np.zeros((3, 1), dtype=dtype))
        assert np.array_equal(xf.logsumexp(x), x[:, 0])

    def test_one_dimensional_input_is_one_row(self):
        loss = xf.cross_entropy(np.array([0.0, 0.0]), np.array(1), reduction="none")
        assert loss.shape == () and np.isclose(loss, np.log(2))

    @pytest.mark.parametrize("tdtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
                                        np.uint64])
    def test_kept_rows_are_the_unweighted_denominator(self, tdtype):
        # the mean divides by the kept rows: the same bits as the mean of the kept rows alone
        ii = -100 if np.dtype(tdtype).kind == "i" else 200
        x = np.arange(20.0).reshape(5, 4) % 3
        y = np.array([ii, 1, 3, ii, 0], dtype=tdtype)
        kept = [1, 2, 4]
        for reduction in ("mean", "sum"):
            assert (xf.cross_entropy(x, y, ignore_index=ii, reduction=reduction)
                    == xf.cross_entropy(x[kept], np.array([1, 3, 0]), reduction=reduction))
        assert np.isnan(xf.cross_entropy(x[:2], np.array([ii, ii], dtype=tdtype), ignore_index=ii))

    @pytest.mark.parametrize("tdtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
                                        np.uint64])
    def test_any_integer_dtype_for_indices(self, tdtype):
        ref = xf.cross_entropy(X, Y, reduction="none")
        assert np.array_equal(xf.cross_entropy(X, Y.astype(tdtype), reduction="none"), ref)

    def test_outputs_keep_the_input_dtype(self):
        for dtype in (np.float32, np.float64):
            x = X.astype(dtype)
            assert xf.cross_entropy(x, Y).dtype == dtype
            assert xf.cross_entropy(x, Y, reduction="none").dtype == dtype
            assert xf.cross_entropy_backward(1.0, x, Y).dtype == dtype
            assert xf.softmax(x).dtype == dtype and xf.logsumexp(x).dtype == dtype


class TestByteOrder:
    """A byte-swapped array has the type number of the native one: every lane must see the swap."""

    @pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
    @pytest.mark.parametrize("n", [3, 3000])          # the plain-call lane (small) and the general path
    def test_swapped_logits_give_the_native_results(self, dtype, n):
        rng = np.random.default_rng(3)
        x = (rng.standard_normal((n, 5)) * 3).astype(dtype)
        y = rng.integers(0, 5, n)
        swapped = x.astype(np.dtype(dtype).newbyteorder("S"))
        loss, grad = xf.cross_entropy_with_grad(swapped, y)
        ref_loss, ref_grad = xf.cross_entropy_with_grad(x, y)
        assert loss == ref_loss and np.array_equal(grad, ref_grad) and grad.dtype.isnative
        assert xf.cross_entropy(swapped, y.astype(np.dtype(np.int64).newbyteorder("S"))) == ref_loss
        t = rng.random(x.shape).astype(dtype)
        ref = xf.binary_cross_entropy_with_logits_with_grad(x, t)
        for xs, ts in ((swapped, t), (x, t.astype(t.dtype.newbyteorder("S")))):
            got = xf.binary_cross_entropy_with_logits_with_grad(xs, ts)
            assert got[0] == ref[0] and np.array_equal(got[1], ref[1])

    def test_swapped_logits_refuse_inplace(self):
        with raises(TypeError, "input", "inplace=True", "byte order"):
            xf.cross_entropy_with_grad(X.astype(">f8" if np.little_endian else "<f8"), Y, inplace=True)


class TestGradientBufferApart:
    """out= (or the input, inplace) must not share memory with what the kernels read while writing it."""

    def test_out_is_the_target_probabilities(self):
        t = np.full((3, 4), 0.25)
        with raises(ValueError, "out", "target"):
            xf.cross_entropy_with_grad(X, t, out=t)

    def test_out_holds_the_weights(self):
        out = np.empty((3, 4))
        with raises(ValueError, "out", "weight"):
            xf.cross_entropy_with_grad(X, Y, weight=out[0], out=out)

    def test_out_holds_grad_output(self):
        out = np.empty((3, 4))
        with raises(ValueError, "out", "grad_output"):
            xf.cross_entropy_with_grad(X, Y, reduction="none", grad_output=out[1, :3], out=out)

    @pytest.mark.parametrize("wrap", ["memoryview", "array_interface", "ctypes"])
    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    @pytest.mark.parametrize("inplace", [False, True])
    def test_grad_output_as_a_buffer_object(self, wrap, dtype, inplace):
        # a buffer object reaches the kernels without a copy (float32 factors of float32 inputs are not
        # even widened first): an overlap with the gradient must be seen through it
        n = 2048
        buf = np.linspace(0.5, 1.5, n + 1).astype(dtype)
        g = buf[:n]
        if wrap == "memoryview":
            g = memoryview(g)
        elif wrap == "array_interface":
            g = type("Holder", (), {"__array_interface__": g.__array_interface__, "keep": g})()
        else:
            g = np.ctypeslib.as_ctypes(g)
        x = np.linspace(-3, 3, n).astype(dtype)
        t = np.full(n, 0.25, dtype=dtype)
        if inplace:
            buf[1:] = x
            with raises(ValueError, "inplace", "grad_output"):
                xf.binary_cross_entropy_with_logits_with_grad(buf[1:], t, reduction="none", grad_output=g,
                                                              inplace=True)
        else:
            with raises(ValueError, "out", "grad_output"):
                xf.binary_cross_entropy_with_logits_with_grad(x, t, reduction="none", grad_output=g,
                                                              out=buf[1:])

    def test_inplace_input_is_the_target(self):
        t = np.full((3, 4), 0.25)
        with raises(ValueError, "inplace", "target"):
            xf.cross_entropy_with_grad(t, t, inplace=True)

    @pytest.mark.parametrize("n", [4, 3000])           # the plain-call lane and the general path
    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_binary_out_is_the_target(self, n, dtype):
        x = np.linspace(-3, 3, 2 * n).reshape(n, 2).astype(dtype)
        t = np.full((n, 2), 0.5, dtype=dtype)
        with raises(ValueError, "out", "target"):
            xf.binary_cross_entropy_with_logits_with_grad(x, t, out=t)

    def test_binary_out_holds_pos_weight(self):
        out = np.empty((3, 4))
        with raises(ValueError, "out", "pos_weight"):
            xf.binary_cross_entropy_with_logits_with_grad(X, np.full((3, 4), 0.5), pos_weight=out[0], out=out)

    def test_probs_out_is_the_target(self):
        t = np.full((3, 4), 0.25)
        with raises(ValueError, "out", "target"):
            xf.cross_entropy_from_probs_with_grad(t.copy(), t, out=t)

    def test_plain_lane_out_over_the_labels(self):
        # float rows over int64 labels: the kernel would read labels it has already overwritten
        buf = np.zeros(3 * 4, dtype=np.float64)
        labels = buf.view(np.int64)[:3]
        with raises(ValueError, "out", "target"):
            xf.cross_entropy_with_grad(X, labels, out=buf.reshape(3, 4))

    @pytest.mark.parametrize("wrap", ["array", "memoryview"])
    def test_out_over_arguments_the_kernels_read_converted(self, wrap):
        # int32 labels, float32 weights and targets, a float16 pos_weight reach the kernels as converted
        # copies, so the kernels' reads were safe; the gradient would still have overwritten the caller's
        # own array, which README's "Use" promises to refuse
        wrapped = (lambda a: a) if wrap == "array" else memoryview
        buf = np.zeros(3 * 4)
        labels = buf.view(np.int32)[:3]
        labels[:] = Y
        with raises(ValueError, "out", "target"):
            xf.cross_entropy_with_grad(X, wrapped(labels), out=buf.reshape(3, 4))
        x32 = X.astype(np.float32)
        out32 = np.zeros((3, 4), np.float32)
        with raises(ValueError, "out", "weight"):
            xf.cross_entropy_with_grad(x32, Y, weight=wrapped(out32.view(np.float16)[0, :4]), out=out32)
        with raises(ValueError, "out", "target"):
            t32 = wrapped(buf.view(np.float32)[:12].reshape(3, 4))
            xf.cross_entropy_from_probs_with_grad(np.full((3, 4), 0.25), t32, out=buf.reshape(3, 4))
        with raises(ValueError, "out", "pos_weight"):
            xf.binary_cross_entropy_with_logits_with_grad(X, np.full((3, 4), 0.5),
                                                          pos_weight=wrapped(buf.view(np.float16)[:4]),
                                                          out=buf.reshape(3, 4))
        with raises(ValueError, "inplace", "target"):
            t32 = wrapped(buf.view(np.float32)[:12].reshape(3, 4))
            xf.binary_cross_entropy_with_logits_with_grad(buf.reshape(3, 4), t32, inplace=True)
        # a list is converted into fresh memory: nothing to refuse
        loss, grad = xf.cross_entropy_with_grad(X, Y.tolist(), out=np.zeros((3, 4)))
        assert loss == xf.cross_entropy(X, Y)


class TestGradientBufferOfItsOwn:
    """A gradient destination whose elements share memory (broadcast, stride 0) would hold, in each
    place, whichever element was written last."""

    @staticmethod
    def _repeated_row(shape):
        return np.lib.stride_tricks.as_strided(np.zeros(shape[-1]), shape, (0, 8), writeable=True)

    def test_out_with_a_repeated_row(self):
        with raises(ValueError, "out: some of its elements share memory"):
            xf.cross_entropy_with_grad(X, Y, out=self._repeated_row(X.shape))

    def test_inplace_on_a_repeated_row(self):
        with raises(ValueError, "input (inplace=True): some of its elements share memory"):
            xf.cross_entropy_with_grad(self._repeated_row(X.shape), Y, inplace=True)

    def test_binary_out_with_a_repeated_row(self):
        with raises(ValueError, "out: some of its elements share memory"):
            xf.binary_cross_entropy_with_logits_with_grad(X, X * 0, out=self._repeated_row(X.shape))

    @pytest.mark.parametrize("view", [lambda b: b.T, lambda b: b[::-1, ::-2], lambda b: b[:, 1::2]])
    def test_strided_views_whose_elements_are_apart_are_taken(self, view):
        base = np.zeros((8, 8))
        out = view(base)
        x = np.arange(out.size, dtype=np.float64).reshape(out.shape) / 7
        y = np.arange(out.shape[0]) % out.shape[1]
        _, g = xf.cross_entropy_with_grad(x, y, out=out)
        assert g is out and np.array_equal(out, xf.cross_entropy_backward(1.0, x, y))


class TestSmallerOptions:
    @pytest.mark.parametrize("f", [xf.cross_entropy, xf.cross_entropy_from_probs])
    def test_nan_policy_raise_sees_target_probabilities(self, f):
        t = np.full((2, 3), 1 / 3)
        t[1, 2] = np.nan
        p = np.full((2, 3), 1 / 3)
        with raises(ValueError, "target", "NaN", "row [1]", "class 2"):
            f(p, t, nan_policy="raise")
        assert np.isnan(f(p, t, reduction="none")[1])       # 'propagate': the row is NaN

    def test_nan_policy_raise_sees_target_probabilities_in_torch_layout(self):
        # (N, C, d): cross_entropy reads these targets in place, without their rows, unless asked to look
        t = np.full((2, 3, 4), 1 / 3)
        t[1, 2, 3] = np.nan
        x = np.zeros((2, 3, 4))
        with raises(ValueError, "target", "NaN", "row [1, 3]", "class 2"):
            xf.cross_entropy(x, t, axis=1, nan_policy="raise")
        assert np.isnan(xf.cross_entropy(x, t, axis=1, reduction="none")[1, 3])

    @pytest.mark.parametrize("ignore", [-0.1, 0.1, 1e40, 2**24 + 1, 10**400])
    def test_binary_ignore_index_must_be_a_target_value(self, ignore):
        x = np.array([0.5, -1.0, 2.0, 0.3], dtype=np.float32)
        t = np.array([1.0, 0.0, 0.5, 1.0], dtype=np.float32)
        with raises(ValueError, "ignore_index", repr(ignore)):
            xf.binary_cross_entropy_with_logits(x, t, ignore_index=ignore)
        with raises(ValueError, "ignore_index"):
            xf.sigmoid_focal_loss(x, t, ignore_index=ignore, reduction="mean")

    @pytest.mark.parametrize("t, ignore, words", [
        ([1 + 1e-9, 0.0], None, ["target", "[0, 1]", "1.000000001"]),
        ([1e300, 0.0], None, ["target", "[0, 1]", "1e+300"]),
        ([16777217, 0], 16777216, ["target", "16777217"]),
        ([0.5000000001, 0.5], 0.5, ["target", "0.5000000001", "becomes ignore_index=0.5", "float32"]),
    ])
    def test_binary_targets_are_checked_before_their_cast(self, t, ignore, words):
        # float32 logits: the cast would make these a valid target or the ignored value
        x = np.zeros(2, np.float32)
        with raises(ValueError, *words):
            xf.binary_cross_entropy_with_logits(x, np.array(t), ignore_index=ignore, reduction="none")
        with raises(ValueError, *words):
            xf.sigmoid_focal_loss(x, np.array(t), ignore_index=ignore)

    def test_binary_targets_of_another_dtype_within_range_are_taken(self):
        x = np.zeros(3, np.float32)
        got = xf.binary_cross_entropy_with_logits(x, np.array([0.5, 1.0, 0.3]), ignore_index=0.5, reduction="none")
        want = xf.binary_cross_entropy_with_logits(x, np.float32([0.5, 1.0, 0.3]), ignore_index=0.5,
                                                   reduction="none")
        assert got.tobytes() == want.tobytes() and got[0] == 0

    def test_binary_targets_narrower_than_the_logits_compare_exactly(self):
        # float32(0.1) is not the float64 0.1: a valid target, not the ignored value (NumPy would compare
        # the Python float in float32)
        x = np.zeros(3)
        loss = xf.binary_cross_entropy_with_logits(x, np.float32([0.1, 1, 0]), ignore_index=0.1, reduction="none")
        assert np.all(loss == np.log(2.0))
        loss = xf.binary_cross_entropy_with_logits(x, np.float32([0.1, 1, 0]), ignore_index=float(np.float32(0.1)),
                                                   reduction="none")
        assert loss[0] == 0 and np.all(loss[1:] == np.log(2.0))
        with raises(ValueError, "target", "[0, 1]", "-0.10000000149011612"):
            xf.binary_cross_entropy_with_logits(np.zeros(2), np.float32([-0.1, 1]), ignore_index=-0.1)

    def test_binary_ignore_index_of_the_targets_dtype_is_ignored_everywhere(self):
        x = np.array([0.5, -1.0, 2.0, 0.3], dtype=np.float32)
        t = np.array([1.0, 0.0, -0.1, 1.0], dtype=np.float32)
        kept = [0, 1, 3]
        loss, grad = xf.binary_cross_entropy_with_logits_with_grad(x, t, ignore_index=float(np.float32(-0.1)))
        ref_loss, ref_grad = xf.binary_cross_entropy_with_logits_with_grad(x[kept], t[kept])
        assert loss == ref_loss and grad[2] == 0
        # the mean over three elements: each gradient entry is 1/3 of its 'sum' entry, as in the reference
        assert np.array_equal(grad[kept], ref_grad)

    def test_ignore_index_beyond_int64(self):
        for f in (xf.cross_entropy, xf.cross_entropy_from_probs):
            with raises(ValueError, "ignore_index", str(2**70)):
                f(np.full((3, 4), 0.25), Y, ignore_index=2**70)

    @pytest.mark.parametrize("bad", ["no", 0.5, None, np.array([True, True])])
    @pytest.mark.parametrize("writeable", [True, False])
    def test_inplace_must_be_a_bool(self, bad, writeable):
        # checked before anything else: an array failed in an `if` with NumPy's ambiguity message, and
        # "no" on a read-only input reported the read-only input
        x = X.copy()
        x.flags.writeable = writeable
        with raises(TypeError, "inplace", repr(bad)):
            xf.cross_entropy_with_grad(x, Y, inplace=bad)
        with raises(TypeError, "inplace", repr(bad)):
            xf.cross_entropy_from_probs_with_grad(np.full((3, 4), 0.25), Y, inplace=bad)
        with raises(TypeError, "inplace", repr(bad)):
            xf.binary_cross_entropy_with_logits_with_grad(x, np.full((3, 4), 0.5), inplace=bad)
        with raises(TypeError, "inplace", repr(bad)):
            xf.sigmoid_focal_loss_with_grad(x, np.full((3, 4), 0.5), inplace=bad)
        with raises(TypeError, "inplace", repr(bad)):
            xf.binary_cross_entropy_with_grad(np.full((3, 4), 0.5), np.full((3, 4), 0.5), inplace=bad)
        assert np.array_equal(x, X)

    @pytest.mark.parametrize("alpha", [np.nan, np.inf, 10**400])
    def test_focal_alpha_not_finite(self, alpha):
        # the rule as it is (-inf is accepted: negative), not "must be finite"
        with raises(ValueError, "alpha", "[0, 1], or negative", repr(alpha)):
            xf.sigmoid_focal_loss(X, np.full((3, 4), 0.5), alpha=alpha)


class TestDocumentedDifferencesFromTorch:
    """README, "Deliberate differences from torch": each one stated there is held here."""

    def test_negative_class_weight_raises(self):
        with raises(ValueError, "weight", "-0.5"):
            xf.cross_entropy(X, Y, weight=np.array([1.0, -0.5, 1.0, 1.0]))

    @pytest.mark.parametrize("f", [xf.log_softmax, xf.softmax, xf.logsumexp])
    def test_softmax_family_needs_a_class_axis(self, f):
        with raises(ValueError, "input", "0-d"):
            f(np.float64(3.0))

    def test_binary_bool_targets_are_zero_and_one(self):
        t = np.array([[True, False], [False, True]])
        x = np.array([[0.3, -2.0], [4.0, 1.5]])
        assert xf.binary_cross_entropy_with_logits(x, t) == xf.binary_cross_entropy_with_logits(x, t.astype(float))

    def test_a_term_with_zero_mass_is_zero_where_torch_gives_nan(self):
        inf = np.inf
        x = np.array([[1.0, -inf, 0.5]])
        loss_p, grad_p = xf.cross_entropy_with_grad(x, np.array([[0.7, 0.0, 0.3]]), reduction="none")
        loss_w, grad_w = xf.cross_entropy_with_grad(x, np.array([1]), weight=np.array([1.0, 0.0, 1.0]),
                                                    reduction="none")
        assert np.isfinite(loss_p).all() and loss_w[0] == 0 and not grad_w.any()
        ignored = np.array([[-inf, -inf], [np.nan, 1.0], [0.5, 1.0]])
        _, grad_i = xf.cross_entropy_with_grad(ignored, np.array([-100, -100, 1]))
        assert not grad_i[:2].any()
        loss_b, grad_b = xf.binary_cross_entropy_with_logits_with_grad(
            np.array([inf, -inf, inf, -inf]), np.array([1.0, 0.0, 0.0, 1.0]), reduction="none")
        assert list(loss_b) == [0.0, 0.0, inf, inf] and np.isfinite(grad_b).all()
        torch = pytest.importorskip("torch")
        F = torch.nn.functional

        def t(v, **kw):
            return torch.tensor(v, dtype=torch.float64 if np.asarray(v).dtype.kind == "f" else None, **kw)

        assert torch.isnan(F.cross_entropy(t(x), t([[0.7, 0.0, 0.3]]), reduction="none")).all()
        assert torch.isnan(F.cross_entropy(t(x), t([1]), weight=t([1.0, 0.0, 1.0]), reduction="none")).all()
        xt = t(ignored, requires_grad=True)
        F.cross_entropy(xt, t([-100, -100, 1])).backward()
        assert torch.isnan(xt.grad[0]).all() and torch.isnan(xt.grad[1]).all()
        assert torch.isnan(F.binary_cross_entropy_with_logits(t([inf, -inf, inf, -inf]), t([1.0, 0.0, 0.0, 1.0]),
                                                              reduction="none")[[0, 1, 3]]).all()

    @pytest.mark.parametrize("smoothing", [-0.1, np.nan])
    def test_label_smoothing_torch_takes_is_refused(self, smoothing):
        with raises(ValueError, "label_smoothing"):
            xf.cross_entropy(X, Y, label_smoothing=smoothing)
        torch = pytest.importorskip("torch")
        # torch 2.13 takes it silently as 0, for index and probability targets
        F, x = torch.nn.functional, torch.tensor(X)
        for target in (torch.tensor(Y), torch.softmax(x.flip(0), 1)):
            assert torch.equal(F.cross_entropy(x, target, label_smoothing=smoothing),
                               F.cross_entropy(x, target, label_smoothing=0.0))


def test_main_on_small_shapes():
    from xentfast.__main__ import main
    assert main(["--rows", "7", "--classes", "1"]) == 0
    assert main(["--rows", "9", "--classes", "50"]) == 0
    with pytest.raises(SystemExit):
        main(["--rows", "3"])


def test_numpy_baseline_leaves_ignored_rows_out():
    from xentfast.testing import naive_cross_entropy_with_grad
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 50))
    y = rng.integers(0, 50, 6)
    y[2] = -100                   # class 950 of a 1000-class row once, an IndexError at 50 classes
    loss, grad = naive_cross_entropy_with_grad(x, y)
    ref_loss, ref_grad = xf.cross_entropy_with_grad(x, y)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-13)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-12, atol=1e-16)
    assert not grad[2].any()


@pytest.mark.parametrize("call, name", [
    (lambda m: xf.cross_entropy(m, np.array([1])), "input"),
    (lambda m: xf.cross_entropy(np.zeros((1, 3)), np.array([1]), weight=m[0] * 0 + 1), "weight"),
    (lambda m: xf.softmax(m), "input"),
    (lambda m: xf.binary_cross_entropy_with_logits(np.zeros(3), m[0] * 0), "target"),
    (lambda m: xf.cross_entropy_with_grad(np.zeros((1, 3)), np.array([1]), out=m), "out"),
])
def test_masked_arrays_are_refused(call, name):
    # np.asarray drops the mask: the 1e30 under it would be read as a logit
    m = np.ma.masked_array([[0.0, 1e30, 0.0]], mask=[[0, 1, 0]])
    with raises(TypeError, f"{name}: a masked array, whose mask would be ignored", f"{name}.filled"):
        call(m)


@pytest.mark.parametrize("call, name", [
    (lambda m: xf.cross_entropy([m[0], [0.0, 0.0, 0.0]], np.array([1, 1])), "input"),
    (lambda m: xf.logsumexp(([m[0]],)), "input"),
    (lambda m: xf.cross_entropy(np.zeros((1, 3)), np.array([1]), weight=[1.0, m[0, 1], 1.0]), "weight"),
    (lambda m: xf.binary_cross_entropy_with_logits(np.zeros(2), [0.0, m[0, 1]]), "target"),
])
def test_masked_arrays_inside_lists_are_refused(call, name):
    # np.asarray([masked, ...]) drops the masks too (m[0, 1] is the masked constant, read as 0.0)
    m = np.ma.masked_array([[0.0, 1e30, 0.0]], mask=[[0, 1, 0]])
    with raises(TypeError, f"{name}: a list holding a masked array, whose mask would be ignored", ".filled"):
        call(m)


@pytest.mark.parametrize("call, words", [
    (lambda: xf.cross_entropy(X, Y, label_smoothing="0.1"), ["label_smoothing", "real number", "'0.1'"]),
    (lambda: xf.cross_entropy(X, Y, label_smoothing=True), ["label_smoothing", "real number", "True"]),
    (lambda: xf.cross_entropy(X, Y, z_loss=True), ["z_loss", "real number"]),
    (lambda: xf.cross_entropy(X, Y, ignore_index=True), ["ignore_index", "an int", "True"]),
    (lambda: xf.cross_entropy(X, Y, axis=True), ["axis", "an int", "True"]),
    (lambda: xf.cross_entropy(X, Y, n_threads=True), ["n_threads", "bool"]),
    (lambda: xf.softmax(X, axis=True), ["axis", "an int"]),
    (lambda: xf.binary_cross_entropy_with_logits(X, X * 0, ignore_index=True), ["ignore_index", "True"]),
    (lambda: xf.sigmoid_focal_loss(X, X * 0, gamma=True), ["gamma", "real number"]),
    # float(False) is 0.0, a clamp of 0: every loss and gradient came out 0
    (lambda: xf.binary_cross_entropy(np.full((3, 4), 0.4), np.ones((3, 4)), log_clamp=False),
     ["log_clamp", "real number", "False"]),
    (lambda: xf.binary_cross_entropy(np.full((3, 4), 0.4), np.ones((3, 4)), log_clamp=np.False_),
     ["log_clamp", "real number"]),
    (lambda: xf.binary_cross_entropy_with_grad(np.full((3, 4), 0.4), np.ones((3, 4)), log_clamp="-1"),
     ["log_clamp", "real number", "'-1'"]),
    (lambda: xf.binary_cross_entropy(np.full((3, 4), 0.4), np.ones((3, 4)), log_clamp=b"-5"),
     ["log_clamp", "real number"]),
])
def test_booleans_and_strings_are_not_numbers(call, words):
    # float("0.1") and operator.index(True) would otherwise let them through as 0.1 and 1
    with raises(TypeError, *words):
        call()


P_BCE, T_BCE = np.full((3, 4), 0.4), np.ones((3, 4))


@pytest.mark.parametrize("name, call", [
    ("label_smoothing", lambda v: xf.cross_entropy(X, Y, label_smoothing=v)),
    ("z_loss", lambda v: xf.cross_entropy(X, Y, z_loss=v)),
    ("gamma", lambda v: xf.sigmoid_focal_loss(X, X * 0, gamma=v)),
    ("eps", lambda v: xf.binary_cross_entropy(P_BCE, T_BCE, eps=v)),
    ("log_clamp", lambda v: xf.binary_cross_entropy(P_BCE, T_BCE, log_clamp=-v)),
])
def test_ints_beyond_float64_name_their_argument(name, call):
    # float(10**400) raises a bare OverflowError (alpha's: test_focal_alpha_not_finite)
    with raises(ValueError, name, "finite"):
        call(10**400)


def test_focal_gamma_beyond_the_kernels_range():
    x, t = np.array([-3.0, 0.0, 3.0]), np.array([0.0, 1.0, 1.0])
    with raises(ValueError, "gamma", "2**400", "1e+130"):
        xf.sigmoid_focal_loss_with_grad(x, t, gamma=1e130)
    loss, grad = xf.sigmoid_focal_loss_with_grad(x, t, gamma=2.0**400)
    assert np.all(np.isfinite(loss)) and np.all(np.isfinite(grad))


@pytest.mark.parametrize("call, words", [
    (lambda: xf.binary_cross_entropy_with_logits(np.array(0.5), np.array(0.5), weight=np.ones(1)),
     ["weight", "shape (1,)", "input's shape ()"]),
    (lambda: xf.binary_cross_entropy_with_logits(np.array(0.5), np.array(0.5), pos_weight=np.ones(1)),
     ["pos_weight", "shape (1,)", "input's shape ()"]),
    (lambda: xf.binary_cross_entropy_with_logits_with_grad(np.array(0.5), np.array(1.0), out=np.zeros(1)),
     ["out", "expected shape ()", "got shape (1,)"]),
    # the dtype too, with the caller's shapes (the message showed the internal (1,) for both)
    (lambda: xf.binary_cross_entropy_with_logits_with_grad(np.array(0.5), np.array(1.0),
                                                           out=np.zeros((), np.float32)),
     ["out", "expected shape () and dtype float64", "got shape (), dtype float32"]),
])
def test_a_0d_binary_input_takes_only_0d_companions(call, words):
    # the problem runs as shape (1,) inside; its arguments still broadcast against () as torch's do
    with raises(ValueError, *words):
        call()
    loss, grad = xf.binary_cross_entropy_with_logits_with_grad(np.array(0.5), np.array(1.0), weight=np.array(2.0),
                                                               out=np.zeros(()))
    assert grad.shape == () and loss == 2 * xf.binary_cross_entropy_with_logits(np.array(0.5), np.array(1.0))


def test_nan_policy_raise_passes_over_ignored_rows_and_elements():
    # ignored rows and elements contribute 0 whatever they hold (even NaN): no reason to raise
    x = np.zeros((3, 4))
    x[1, 2] = np.nan
    assert xf.cross_entropy(x, np.array([0, -100, 1]), nan_policy="raise") == xf.cross_entropy(
        np.zeros((3, 4)), np.array([0, -100, 1]))
    with raises(ValueError, "input", "NaN logit in row [1] at class 2"):
        xf.cross_entropy(x, np.array([0, 1, -100]), nan_policy="raise")
    t = np.zeros((3, 4))
    t[1, 2] = -1.0
    xf.binary_cross_entropy_with_logits(x, t, ignore_index=-1, nan_policy="raise")
    x[2, 3] = np.nan
    with raises(ValueError, "input", "NaN at index [2, 3]"):
        xf.binary_cross_entropy_with_logits(x, t, ignore_index=-1, nan_policy="raise")


@pytest.mark.parametrize("call, name", [
    (lambda: xf.cross_entropy([[1.0, 2.0], [3.0]], [0, 1]), "input"),
    (lambda: xf.cross_entropy([[1.0, 2.0], [3.0, 4.0]], [0, [1]]), "target"),
    (lambda: xf.binary_cross_entropy_with_logits([0.0, 1.0], [[0.0], 1.0]), "target"),
])
def test_a_ragged_list_is_named(call, name):
    with raises(ValueError, f"{name}: ", "inhomogeneous"):
        call()


def test_a_list_nested_beyond_numpys_dimensions_is_named():
    too_deep = 1.0
    for _ in range(65):
        too_deep = [too_deep]
    with raises(ValueError, "input: ", "maximum number of dimension"):
        xf.softmax(too_deep)
    with raises(ValueError, "target: ", "maximum number of dimension"):
        xf.binary_cross_entropy_with_logits([[0.5]], too_deep)
