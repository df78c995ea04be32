"""sharedtensor: zero-copy tensors from a stserver, in Python.

    import sharedtensor as st
    with st.Client() as c:                        # device 0's socket
        w = c.call("make_tensor", rows=2, cols=3)  # a torch tensor, mapped
        with c.call("load_linear", input_dim=16) as h:   # managed: a Handle
            layer = st.load_into(torch.nn.Linear(16, 4), h.value)
        x = st.zeros((2, 3))                       # memory endpoints can take
        c.call("scale", x=x, k=2.0)                # the endpoint writes into x

Pure Python over libstclient (ctypes); tensors cross into frameworks
through DLPack without a copy. docs/python.md has the details.
"""
from .errors import *  # noqa: F401,F403
from .errors import Error, __all__ as _error_names
from .client import Client, Handle, Module
from .task import Task
from .keys import StateDict
from .live import LiveKey, Binding
from .tensor import SharedTensor
from .nn import load_into
from .convert import keep_results, kept_results
from . import handoff  # noqa: F401  (sharedtensor.handoff.Handoff)
from .alloc import empty, zeros, empty_like, zeros_like
from . import buffer  # noqa: F401  (sharedtensor.buffer.Buffer)
from .buffer import Buffer, create as buffer_create, open as buffer_open, unlink as buffer_unlink
from . import _lib

__version__ = "0.1.0"
library_path = _lib.path

__all__ = ["Client", "Handle", "Module", "Task", "StateDict", "LiveKey", "Binding", "SharedTensor", "load_into",
           "library_path", "empty", "zeros", "empty_like", "zeros_like", "Buffer",
           "buffer_create", "buffer_open", "buffer_unlink", "keep_results", "kept_results"] + \
    list(_error_names)
