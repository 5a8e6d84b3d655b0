"""k3kernels::kda_proj: Kimi-K3's KDA input projection on torch tensors (CPU backend for CPU tensors, the CUDA
backend on the tensor's device and torch's current stream for CUDA tensors), with a fake implementation for
torch.compile."""
import ctypes
from typing import Tuple

import torch

from . import _capi as C
from . import _ops as O
from ._torch import _device_key, _make, _plan, _ptr, _stream, _t, _ws

_lib = O._lib


def _shapes(x, packed_weight, f_b_weight, head_dim):
    """(m, h, p, q, g, fa) of a kda_proj call; every mismatch named."""
    m, h = x.shape
    p = packed_weight.shape[0]
    g, fa = f_b_weight.shape
    if packed_weight.shape[1] != h:
        raise ValueError("packed_weight must be [P, H] with H = x.shape[1] = %d (got %s)" %
                         (h, tuple(packed_weight.shape)))
    if head_dim < 1 or g % head_dim:
        raise ValueError("f_b_weight must be [local_heads * head_dim, fa] with head_dim = %d (got %s)" %
                         (head_dim, tuple(f_b_weight.shape)))
    if not 1 <= m <= 16:
        raise ValueError("x must have 1 to 16 rows (got %d)" % m)
    q = 4 * g
    if p <= q:
        raise ValueError("packed_weight must have more than 4 * f_b rows = %d rows (got %d)" % (q, p))
    return m, h, p, q, g, fa


def kda_proj_impl(x, packed_weight, f_b_weight, head_dim):
    dev = _device_key(x)
    _t("x", x, torch.bfloat16, 2, dev)
    _t("packed_weight", packed_weight, torch.bfloat16, 2, dev)
    _t("f_b_weight", f_b_weight, torch.bfloat16, 2, dev)
    m, h, p, q, g, fa = _shapes(x, packed_weight, f_b_weight, head_dim)

    def make(ctx):
        d = C.KdaProjDesc()
        _lib.k3_kda_proj_desc_init(ctypes.byref(d))
        d.hidden, d.local_heads, d.head_dim, d.fa_dim, d.packed_rows = h, g // head_dim, head_dim, fa, p
        d.max_tokens = 16
        return _make(ctx, _lib.k3_kda_proj_plan_create, _lib.k3_kda_proj_plan_destroy,
                     _lib.k3_kda_proj_workspace_size, d)

    plan = _plan(dev, ("kda", h, g // head_dim, head_dim, fa, p), make)
    ctx = plan.ctx
    qkvg = torch.empty((m, q), dtype=torch.bfloat16, device=x.device)
    fab = torch.empty((m, p - q), dtype=torch.bfloat16, device=x.device)
    g1 = torch.empty((m, g), dtype=torch.bfloat16, device=x.device)
    ws = _ws(plan, x)
    O._check(_lib.k3_kda_proj_run(plan.handle, m, _ptr(x), _ptr(packed_weight), _ptr(f_b_weight), _ptr(qkvg),
                                  _ptr(fab), _ptr(g1), _ptr(ws), plan.ws_bytes, _stream(dev)), ctx)
    return qkvg, fab, g1


@torch.library.custom_op("k3kernels::kda_proj", mutates_args=())
def kda_proj_op(x: torch.Tensor, packed_weight: torch.Tensor, f_b_weight: torch.Tensor,
                head_dim: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return kda_proj_impl(x, packed_weight, f_b_weight, head_dim)


@kda_proj_op.register_fake
def _(x, packed_weight, f_b_weight, head_dim):
    m = x.shape[0]
    g = f_b_weight.shape[0]
    return (x.new_empty((m, 4 * g)), x.new_empty((m, packed_weight.shape[0] - 4 * g)), x.new_empty((m, g)))


O.TORCH_IMPLS["kda_proj"] = kda_proj_impl
