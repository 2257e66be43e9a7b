"""The one version shim between dgl_maxk's operators and ``torch.library``.

:func:`operator` declares an operator once, at import, from its implementation (which picks
the backend by device), a fake implementation (output shapes and dtypes, no data) and, for a
differentiable one, ``setup_context`` and ``backward``. Where torch has
``torch.library.custom_op`` (2.4 and later) it becomes the custom op ``dgl_maxk::<name>``
(``torch.ops.dgl_maxk.<name>``), which ``torch.compile`` records as one opaque call. Eager
calls go to an autograd ``Function`` made of the same pieces, or to the implementation
itself: the dispatcher's Python path cost about 0.1 ms a call on an H200 host, more than most
of the launches behind it. On an older torch the Function and the implementation are all
there is (``torch.compile`` then traces into them, with graph breaks).
"""
from __future__ import annotations

import functools

import torch

#: Whether torch declares custom ops (``torch.library.custom_op``, torch 2.4 and later).
HAS_CUSTOM_OP = hasattr(torch.library, "custom_op")


def compiling() -> bool:
    """Whether dynamo (``torch.compile``, ``torch.export``) is tracing the caller, which then
    runs no Python of its own when the compiled code runs (only the ops)."""
    return HAS_CUSTOM_OP and torch.compiler.is_compiling()


def tracing() -> bool:
    """Whether a call must go through the op: while dynamo traces, under TorchScript tracing
    (which records the op, not a launch it cannot see) and under a dispatch mode
    (FakeTensorMode, make_fx, FlopCounterMode: tensors without data to launch on, or calls
    to record)."""
    return compiling() or (HAS_CUSTOM_OP and (torch._C._get_tracing_state() is not None
                                              or torch._C._len_torch_dispatch_stack() > 0))


def operator(name: str, fake, setup_context=None, backward=None, side_effect=False):
    """Declare the decorated implementation as the operator ``dgl_maxk::<name>`` and return
    the function that calls it: through the custom op while :func:`tracing`, else through an
    autograd Function of ``setup_context`` and ``backward`` (without them: the implementation
    itself). ``side_effect=True``: an op that returns nothing and acts only by what it does
    (raising, recording), which graph passes must not remove as unused."""
    def declare(impl):
        eager = impl if backward is None else _function(name, impl, setup_context,
                                                        backward).apply
        if not HAS_CUSTOM_OP:
            return eager
        op = torch.library.custom_op(f"dgl_maxk::{name}", impl, mutates_args=())
        op.register_fake(fake)
        if backward is not None:
            op.register_autograd(backward, setup_context=setup_context)
        if side_effect:
            _keep_when_unused(getattr(torch.ops.dgl_maxk, name).default)

        @functools.wraps(impl)
        def call(*args):
            return op(*args) if tracing() else eager(*args)
        return call
    return declare


def _function(name, impl, setup_context, backward):
    """An autograd Function of the pieces, its forward taking ``ctx`` (as Functions did
    before ``setup_context``): Function.apply binds the arguments of a forward without
    ``ctx`` through ``inspect.signature``, about 0.1 ms a call."""
    def forward(ctx, *args):
        output = impl(*args)
        setup_context(ctx, args, output)
        return output
    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                   "backward": staticmethod(backward)})


def _keep_when_unused(overload):
    mark = getattr(torch.fx.node, "has_side_effect", None)
    if mark is not None:
        mark(overload)
    else:  # torch < 2.6
        torch.fx.node._side_effectful_functions.add(overload)
