"""Loads the C++ extension and turns hdk's C++ errors into :class:`HdkError`."""

import torch

try:
    from hdk import _C
except ImportError as error:
    raise ImportError(
        "hdk's C++ extension (hdk._C) is not built or cannot be loaded: "
        f"{error}. Build and install it with `pip install --no-build-isolation ./python` "
        "(see docs/python.md)."
    ) from error


class HdkError(ValueError, RuntimeError):
    """An invalid hdk call, or a failure inside hdk; the message is hdk's own.

    Messages name the operation, the argument, what was expected and what was given, e.g.
    ``hdk::gdn::decode: argument 'k' must have shape [B, T, H, K] = [3, 2, 2, 16], got
    [3, 2, 2, 8]``. It is a ValueError (most failures are bad arguments) and a RuntimeError
    (what torch ops raise), so either ``except`` clause catches it.
    """


HdkError.__module__ = "hdk"


def library_version():
    """Version of the libhdk inside (or linked by) the extension."""
    return _C.library_version()


def built_with_cuda():
    """True when libhdk has its CUDA backend (the default pip build is CPU-only)."""
    return bool(_C.built_with_cuda())


def extension_has_cuda():
    """True when the torch binding can run CUDA tensors (it was built with torch's CUDA)."""
    return bool(_C.extension_has_cuda())


def _is_compiling():
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        return compiler.is_compiling()
    dynamo = getattr(torch, "_dynamo", None)
    if dynamo is not None and hasattr(dynamo, "is_compiling"):
        return dynamo.is_compiling()
    return False


def run_op(op, *args):
    """Calls a torch.ops.hdk op; an error hdk raised surfaces as HdkError with hdk's message."""
    # Under torch.compile the op is traced, not run, and dynamo would have to trace the
    # exception handling too; errors of a compiled graph surface as torch raises them.
    if _is_compiling():
        return op(*args)
    try:
        return op(*args)
    except (ValueError, RuntimeError) as error:
        message = str(error)
        if message.startswith("hdk"):
            raise HdkError(message) from None
        raise
