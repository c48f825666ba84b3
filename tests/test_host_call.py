"""NumPy functions called from compiled programs through XLA's FFI (``fem._host``)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sphyr_jax.fem.host import host_call


def _affine(a, idx, keep):
    """Rows of ``a`` gathered by ``idx``, masked by ``keep``; and a row sum."""
    rows = a[idx] * keep[:, None]
    return rows, rows.sum(axis=1)


def _fails(a):
    raise FloatingPointError(f"no luck with {a.shape}")


def _writes_input(a):
    a[0] = 1.0
    return a


def test_host_call_equals_numpy_with_mixed_dtypes_and_two_outputs():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 3))
    idx = np.array([4, 0, 2, 2], np.int64)
    keep = np.array([True, False, True, True])
    result = (jax.ShapeDtypeStruct((4, 3), jnp.float64), jax.ShapeDtypeStruct((4,), jnp.float64))
    rows, sums = jax.jit(lambda *xs: host_call(_affine, result, *xs))(a, idx, keep)
    want_rows, want_sums = _affine(a, idx, keep)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(sums, want_sums)


def test_host_call_inside_a_loop_and_under_vmap():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 5, 2))
    idx = np.array([1, 3], np.int64)
    keep = np.array([True, True])
    result = (jax.ShapeDtypeStruct((2, 2), jnp.float64), jax.ShapeDtypeStruct((2,), jnp.float64))

    def twice(x):
        def body(_, rows):
            grown = jnp.concatenate([rows, rows[:1], rows, rows[:1]], axis=0)[:5]
            return host_call(_affine, result, grown, idx, keep)[0]
        return jax.lax.fori_loop(0, 2, body, host_call(_affine, result, x, idx, keep)[0])

    got = jax.jit(jax.vmap(twice))(a)
    for b in range(3):
        want = _affine(a[b], idx, keep)[0]
        want = _affine(np.concatenate([want, want[:1], want, want[:1]])[:5], idx, keep)[0]
        want = _affine(np.concatenate([want, want[:1], want, want[:1]])[:5], idx, keep)[0]
        np.testing.assert_array_equal(got[b], want)


@pytest.mark.parametrize("fn, message", [(_fails, "no luck with (2, 2)"),
                                         (_writes_input, "read-only")])
def test_an_error_on_the_host_fails_the_program_with_its_message(fn, message):
    call = jax.jit(lambda x: host_call(fn, jax.ShapeDtypeStruct((2, 2), jnp.float64), x))
    with pytest.raises(Exception, match=re.escape(message)):
        jax.block_until_ready(call(np.zeros((2, 2))))
