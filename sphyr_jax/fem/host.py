r"""NumPy functions called from compiled CPU programs through XLA's FFI.

``jax.pure_callback`` moves every argument onto a JAX device and back before
the function sees it (a cost that grows with the arguments' bytes), and from
programs running on several CPU devices at once that move waits on the
thread pool the programs themselves hold (a sharded run was seen to stall).
A foreign-function target reaches the function with the program's own
buffers instead: XLA calls a C function pointer with a call frame holding
pointers to the argument and result buffers.  Here that pointer is a
:mod:`ctypes` callback into Python, which wraps the buffers as NumPy arrays
without copying, calls the function, and writes its result into the result
buffer: a fixed cost per call, whatever the arguments' size
(``benchmarks/host_call.py`` measures both mechanisms per call).  The
structures below mirror XLA's stable FFI C API (``xla/ffi/api/c_api.h``, API
version 0.1).

Only CPU programs can call these targets.  A function that raises reports an
XLA error with its message; the program fails instead of reading garbage.
"""

from __future__ import annotations

import ctypes
import threading

import jax
import numpy as np

_c = ctypes
_METADATA_EXTENSION = 1  # XLA_FFI_Extension_Metadata
_EXECUTE = 3  # XLA_FFI_ExecutionStage_EXECUTE
_ERROR_INTERNAL = 13  # XLA_FFI_Error_Code_INTERNAL
_DTYPES = {1: np.bool_, 4: np.int32, 5: np.int64, 11: np.float32, 12: np.float64}


class _Extension(_c.Structure):
    pass


_Extension._fields_ = [("struct_size", _c.c_size_t), ("type", _c.c_int),
                       ("next", _c.POINTER(_Extension))]


class _List(_c.Structure):  # XLA_FFI_Args / XLA_FFI_Rets
    _fields_ = [("struct_size", _c.c_size_t), ("extension_start", _c.c_void_p),
                ("size", _c.c_int64), ("types", _c.c_void_p),
                ("items", _c.POINTER(_c.c_void_p))]


class _Attrs(_c.Structure):
    _fields_ = [("struct_size", _c.c_size_t), ("extension_start", _c.c_void_p),
                ("size", _c.c_int64), ("types", _c.c_void_p), ("names", _c.c_void_p),
                ("attrs", _c.c_void_p)]


class _CallFrame(_c.Structure):
    _fields_ = [("struct_size", _c.c_size_t), ("extension_start", _c.POINTER(_Extension)),
                ("api", _c.c_void_p), ("ctx", _c.c_void_p), ("stage", _c.c_int),
                ("args", _List), ("rets", _List), ("attrs", _Attrs),
                ("future", _c.c_void_p)]


class _Buffer(_c.Structure):
    _fields_ = [("struct_size", _c.c_size_t), ("extension_start", _c.c_void_p),
                ("dtype", _c.c_int), ("data", _c.c_void_p), ("rank", _c.c_int64),
                ("dims", _c.POINTER(_c.c_int64))]


class _Version(_c.Structure):
    _fields_ = [("struct_size", _c.c_size_t), ("extension_start", _c.c_void_p),
                ("major", _c.c_int), ("minor", _c.c_int)]


class _Metadata(_c.Structure):
    _fields_ = [("struct_size", _c.c_size_t), ("api_version", _Version),
                ("traits", _c.c_uint32), ("state_type_id", _c.c_int64)]


class _MetadataExtension(_c.Structure):
    _fields_ = [("base", _Extension), ("metadata", _c.POINTER(_Metadata))]


class _ErrorArgs(_c.Structure):  # XLA_FFI_Error_Create_Args
    _fields_ = [("struct_size", _c.c_size_t), ("extension_start", _c.c_void_p),
                ("message", _c.c_char_p), ("errc", _c.c_int)]


class _ApiHead(_c.Structure):  # the start of XLA_FFI_Api, up to XLA_FFI_Error_Create
    _fields_ = [("struct_size", _c.c_size_t), ("extension_start", _c.c_void_p),
                ("api_version", _Version), ("internal_api", _c.c_void_p),
                ("error_create", _c.c_void_p)]


_HANDLER = _c.CFUNCTYPE(_c.c_void_p, _c.POINTER(_CallFrame))
_ERROR_CREATE = _c.CFUNCTYPE(_c.c_void_p, _c.POINTER(_ErrorArgs))


def _array(address: int) -> np.ndarray:
    """A NumPy view of one XLA buffer (no copy)."""
    buf = _Buffer.from_address(address)
    shape = tuple(buf.dims[i] for i in range(buf.rank))
    dtype = np.dtype(_DTYPES[buf.dtype])
    size = int(np.prod(shape, dtype=np.int64))
    if size == 0:
        return np.zeros(shape, dtype)
    raw = (_c.c_char * (size * dtype.itemsize)).from_address(buf.data)
    return np.frombuffer(raw, dtype).reshape(shape)


def _error(api: int, message: str) -> int:
    """An XLA_FFI_Error carrying ``message``, made by XLA's own API."""
    head = _ApiHead.from_address(api)
    args = _ErrorArgs(_c.sizeof(_ErrorArgs), None, message.encode()[:4000], _ERROR_INTERNAL)
    return _ERROR_CREATE(head.error_create)(_c.byref(args))


def _handler(fn):
    """The C handler of one NumPy function ``fn(*inputs) -> outputs``."""

    def handle(frame_ptr):
        frame = frame_ptr.contents
        ext = frame.extension_start
        if ext and ext.contents.type == _METADATA_EXTENSION:
            meta = _c.cast(ext, _c.POINTER(_MetadataExtension)).contents.metadata.contents
            meta.api_version.struct_size = _c.sizeof(_Version)
            meta.api_version.major, meta.api_version.minor = 0, 1
            meta.traits = 0
            return None
        if frame.stage != _EXECUTE:
            return None
        try:
            inputs = [_array(frame.args.items[i]) for i in range(frame.args.size)]
            for a in inputs:
                a.flags.writeable = False
            outputs = [_array(frame.rets.items[i]) for i in range(frame.rets.size)]
            result = fn(*inputs)
            result = result if isinstance(result, tuple) else (result,)
            for out, value in zip(outputs, result, strict=True):
                np.copyto(out, value, casting="same_kind")
            return None
        except Exception as exc:  # reported by XLA as the program's error
            return _error(frame.api, f"{fn.__name__} failed on the host: {exc!r}")

    return _HANDLER(handle)


_LOCK = threading.Lock()
# Registered handlers by target name.  XLA keeps a target for the life of the
# process (compiled programs call it by name), so this registry is never
# released; it holds one entry per host function of the library.
_KEEP: dict[str, object] = {}


def _target(fn) -> str:
    """Register ``fn`` as an FFI target of the CPU platform (once) and name it."""
    name = f"sphyr_jax.{fn.__module__}.{fn.__qualname__}"
    if name not in _KEEP:
        with _LOCK:
            if name not in _KEEP:
                handler = _handler(fn)
                jax.ffi.register_ffi_target(
                    name, jax.ffi.pycapsule(_c.cast(handler, _c.c_void_p)), platform="cpu")
                _KEEP[name] = handler
    return name


def host_call(fn, result, *args):
    """``fn(*args)`` on the host, from a compiled CPU program.

    Args:
        fn: a module-level NumPy function of C-ordered arrays returning one
            array (or a tuple) of the ``result`` shapes; it must not keep or
            modify its inputs.
        result: ``jax.ShapeDtypeStruct`` (or a tuple of them) of the outputs.
        *args: arrays (float64, int32/64, bool).

    Returns:
        The outputs as traced arrays.  Under ``vmap`` the call runs once per
        batch element.
    """
    return jax.ffi.ffi_call(_target(fn), result, vmap_method="sequential")(*args)
