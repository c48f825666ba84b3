"""Importing sphyr_jax changes nothing process-wide; its caches are bounded and released.

Independent truths: the kernel's record of the process (``/proc/self/status``
for the umask, the interpreter's thread list) and the registration calls
themselves, watched from a fresh interpreter before the package is imported;
for the caches, their own entry counts and JAX's count of compiled programs.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import pathlib
import pkgutil
import subprocess
import sys

import numpy as np
import pytest

import sphyr_jax as sj
from sphyr_jax import runtime
from sphyr_jax.fem import fea, structured

REPO = pathlib.Path(__file__).resolve().parents[1]

# Watches os.umask, os.register_at_fork and atexit.register (recording the
# calls made from sphyr_jax's own files), the umask the kernel reports and the
# threads, around `import sphyr_jax`; then makes the LAPACK thread pool exist
# and shuts it down.  The dependencies are imported first, so their own
# import-time work is not counted.
SCRIPT = r"""
import atexit, json, os, sys, threading
import jax, jax.numpy, numpy, equinox, jaxtyping

PACKAGE = os.path.join(sys.argv[1], "sphyr_jax")
calls = {"umask": [], "fork": [], "atexit": []}

def ours():
    return sys._getframe(2).f_code.co_filename.startswith(PACKAGE)

def watch(module, name, key):
    real = getattr(module, name)
    def wrapper(*args, **kwargs):
        if ours():
            calls[key].append(name)
        return real(*args, **kwargs)
    setattr(module, name, wrapper)

watch(os, "umask", "umask")
watch(os, "register_at_fork", "fork")
watch(atexit, "register", "atexit")

def kernel_umask():
    for line in open("/proc/self/status"):
        if line.startswith("Umask:"):
            return line.split()[1]
    return None

os.umask(0o027)  # not the usual default, so a reset would show
mask, threads = kernel_umask(), {t.ident for t in threading.enumerate()}
import sphyr_jax
from sphyr_jax.fem import _lapack
out = {"import": {k: list(v) for k, v in calls.items()},
       "umask_kept": kernel_umask() == mask,
       "new_threads": len({t.ident for t in threading.enumerate()} - threads)}
_lapack._pool().submit(lambda: None).result()
_lapack._pool()
out["pool_threads"] = sum(t.name.startswith("sphyr-lapack") for t in threading.enumerate())
out["first_use"] = {k: list(v) for k, v in calls.items()}
_lapack.shutdown_threads()
out["after_shutdown"] = sum(t.name.startswith("sphyr-lapack") for t in threading.enumerate())
print(json.dumps(out))
"""


def test_import_changes_nothing_process_wide_and_the_pool_starts_on_first_use():
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO)], capture_output=True,
                          text=True, timeout=300, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["import"] == {"umask": [], "fork": [], "atexit": []}
    assert out["umask_kept"] is True and out["new_threads"] == 0
    # First use: one pool, its exit and fork hooks registered once.
    assert out["pool_threads"] >= 1
    assert out["first_use"] == {"umask": [], "fork": ["register_at_fork"],
                                "atexit": ["register"]}
    assert out["after_shutdown"] == 0


def _package_modules():
    for info in pkgutil.walk_packages(sj.__path__, "sphyr_jax."):
        try:
            yield importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed
            continue


def test_every_cache_that_grows_with_its_inputs_is_bounded():
    unbounded = []
    for module in _package_modules():
        for name, obj in vars(module).items():
            if isinstance(obj, runtime.BoundedCache):
                assert obj.maxsize >= 1 and runtime.cache_limits()[obj.name] == obj.maxsize
            elif hasattr(obj, "cache_info") and hasattr(obj, "__wrapped__"):
                takes_input = bool(inspect.signature(obj.__wrapped__).parameters)
                if takes_input and obj.cache_info().maxsize is None:
                    unbounded.append(f"{module.__name__}.{name}")
    assert not unbounded, unbounded
    limits = runtime.cache_limits()
    for name in ("sphyr_jax.fem.linear_solve.kernels", "sphyr_jax.fem.linear_solve.compliance_rule",
                 "sphyr_jax.sharding._compiled", "sphyr_jax.fem.structured.get_grid"):
        assert limits[name] >= 1


def test_a_cache_keeps_at_most_its_bound_and_can_be_resized():
    name = "sphyr_jax.fem.structured.get_grid"
    before = runtime.cache_limits()[name]
    try:
        runtime.set_cache_limit(name, 2)
        grids = [structured.get_grid((n, n + 1)) for n in range(1, 6)]
        assert runtime.cache_sizes()[name] == 2
        assert structured.get_grid((5, 6)) is grids[-1]  # the latest are kept
        assert structured.get_grid((1, 2)) is not grids[0]  # the oldest were dropped
    finally:
        runtime.set_cache_limit(name, before)
    with pytest.raises(KeyError, match="no cache named"):
        runtime.set_cache_limit("sphyr_jax.nothing", 3)
    with pytest.raises(ValueError, match="at least 1"):
        runtime.set_cache_limit(name, 0)


def test_clear_caches_releases_every_cache_and_compiled_program():
    case = sj.load_case_from_grid([list(r) for r in ("0LL0", "1001", "S00S")])
    rho = np.full((2,) + case.shape, 0.7)
    first = np.asarray(sj.compliance(case, rho))
    assert runtime.cache_sizes()["sphyr_jax.fem.linear_solve.compliance_rule"] >= 1
    assert fea._JIT["compliance"]._cache_size() >= 1
    sj.clear_caches()
    assert not any(runtime.cache_sizes().values())
    assert fea._JIT["compliance"]._cache_size() == 0
    np.testing.assert_array_equal(np.asarray(sj.compliance(case, rho)), first)


def test_bounded_cache_is_an_lru_cache():
    calls = []

    @functools.partial(runtime.BoundedCache, maxsize=2)
    def square(x):
        calls.append(x)
        return x * x

    assert [square(v) for v in (1, 2, 1, 3, 2)] == [1, 4, 1, 9, 4]
    assert calls == [1, 2, 3, 2]  # 2 was the least recently used when 3 came
    assert square.cache_info().currsize == 2 and square.__name__ == "square"
