"""The C API of libk3 through ctypes: the library, the structs of include/k3.h, the function signatures.

include/k3.h is the one source of truth; these mirrors are checked against it by reading back the defaults that the
library's own *_desc_init functions write (check_layouts), so a layout that drifted fails at import, not later.
"""
import ctypes
import importlib.machinery
import importlib.util
import os

c_int32, c_int64, c_float, c_size_t, c_void_p, c_char_p = (ctypes.c_int32, ctypes.c_int64, ctypes.c_float,
                                                            ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p)

# enums (append-only in the C header)
BACKEND_CPU, BACKEND_CUDA, BACKEND_AUTO = 0, 1, 2
STATUS_SUCCESS = 0
DTYPE_BF16, DTYPE_F32 = 0, 1
ROUTER_SIGMOID_NOAUX_TC, ROUTER_SOFTMAX = 0, 1
WEIGHT_BF16, WEIGHT_NVFP4, WEIGHT_MXFP4 = 0, 1, 2
FP4_NVFP4, FP4_MXFP4 = 0, 1
SCALE_LINEAR, SCALE_SWIZZLED = 0, 1
MOE_W4A16, MOE_W4A4 = 0, 1
ACT = {"silu": 0, "swigluoai": 1, "swigluoai_uninterleave": 2, "relu2_no_mul": 3, "situ": 4}

LOG_FN = ctypes.CFUNCTYPE(None, c_void_p, ctypes.c_int, c_char_p)


class CtxOptions(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int), ("device", c_int32), ("sim_major", c_int32), ("sim_minor", c_int32),
                ("sim_sm_count", c_int32), ("log_fn", c_void_p), ("log_user", c_void_p), ("log_level", ctypes.c_int),
                ("skip_pointer_checks", c_int32)]


class ArchInfo(ctypes.Structure):
    _fields_ = [("cc_major", c_int32), ("cc_minor", c_int32), ("sm_version", c_int32), ("simulated", c_int32),
                ("has_mixed_bf16_fma", c_int32), ("has_fp4_mma", c_int32), ("table", ctypes.c_int),
                ("cuda_backend_usable", c_int32), ("sm_count", c_int32), ("l2_bytes", c_int64),
                ("driver_version", c_int32), ("runtime_version", c_int32), ("device_name", ctypes.c_char * 128)]


class ActDesc(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("alpha", c_float), ("beta", c_float), ("limit", c_float),
                ("situ_beta", c_float), ("situ_linear_beta", c_float)]


class LinearDesc(ctypes.Structure):
    _fields_ = [("n", c_int64), ("k", c_int64), ("max_m", c_int64), ("x_stride", c_int64), ("y_stride", c_int64),
                ("accum", ctypes.c_int), ("force_kernel", ctypes.c_int), ("force_config", c_char_p)]


class RouterDesc(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("num_experts", c_int32), ("top_k", c_int32), ("hidden", c_int64),
                ("gate_dtype", ctypes.c_int), ("renormalize", c_int32), ("scaling_factor", c_float),
                ("max_tokens", c_int64)]


class MoeDesc(ctypes.Structure):
    _fields_ = [("num_experts", c_int32), ("top_k", c_int32), ("hidden", c_int64), ("inter", c_int64),
                ("format", ctypes.c_int), ("scale_layout", ctypes.c_int), ("w13_separate_scale_2", c_int32),
                ("mode", ctypes.c_int), ("act", ActDesc), ("max_tokens", c_int64), ("force_shape", c_int32),
                ("global_experts", c_int32)]


class KdaProjDesc(ctypes.Structure):
    _fields_ = [("hidden", c_int64), ("local_heads", c_int64), ("head_dim", c_int64), ("fa_dim", c_int64),
                ("packed_rows", c_int64), ("max_tokens", c_int64), ("overlap_max_tokens", c_int64),
                ("run_n_shape", ctypes.c_int), ("qkvg_kernel", ctypes.c_int)]


class MoeWeights(ctypes.Structure):
    _fields_ = [("w13", c_void_p), ("w13_scale", c_void_p), ("w13_scale_2", c_void_p), ("w13_input_scale", c_void_p),
                ("w2", c_void_p), ("w2_scale", c_void_p), ("w2_scale_2", c_void_p), ("w2_input_scale", c_void_p),
                ("expert_map", c_void_p)]


class ParallelDesc(ctypes.Structure):
    _fields_ = [("layout", ctypes.c_int), ("rank", c_int32), ("size", c_int32), ("nccl_comm", c_void_p),
                ("tokens", ctypes.c_int)]


class LatentMoeDesc(ctypes.Structure):
    _fields_ = [("hidden", c_int64), ("router", RouterDesc), ("experts", MoeDesc), ("shared_inter", c_int64),
                ("shared_act", ActDesc), ("rms_eps", c_float), ("max_tokens", c_int64), ("parallel", ParallelDesc),
                ("schedule", ctypes.c_int)]


class LatentMoeWeights(ctypes.Structure):
    _fields_ = [("gate", c_void_p), ("bias", c_void_p), ("down_proj", c_void_p), ("experts", MoeWeights),
                ("norm", c_void_p), ("up_proj", c_void_p), ("shared_gate_up", c_void_p), ("shared_down", c_void_p)]


class MoeLayer(ctypes.Structure):
    """k3_moe_layer: one checkpoint layer's MoE block in host memory, owned by the library."""
    _u8p, _f32p, _u16p = ctypes.POINTER(ctypes.c_uint8), ctypes.POINTER(c_float), ctypes.POINTER(ctypes.c_uint16)
    _fields_ = [("layer", c_int32), ("source_format", ctypes.c_int), ("fp4", ctypes.c_int), ("num_experts", c_int32),
                ("latent", c_int64), ("inter", c_int64), ("w13", _u8p), ("w13_scale", _u8p), ("w2", _u8p),
                ("w2_scale", _u8p), ("w13_bytes", c_size_t), ("w13_scale_bytes", c_size_t), ("w2_bytes", c_size_t),
                ("w2_scale_bytes", c_size_t), ("w13_scale_2", _f32p), ("w2_scale_2", _f32p),
                ("w13_input_scale", _f32p), ("w2_input_scale", _f32p), ("hidden", c_int64), ("shared_inter", c_int64),
                ("gate_dtype", ctypes.c_int), ("gate", c_void_p), ("bias", _f32p), ("shared_gate_up", _u16p),
                ("shared_down", _u16p), ("down_proj", _u16p), ("norm", _u16p), ("up_proj", _u16p),
                ("gate_bytes", c_size_t), ("bias_bytes", c_size_t), ("shared_gate_up_bytes", c_size_t),
                ("shared_down_bytes", c_size_t), ("down_proj_bytes", c_size_t), ("norm_bytes", c_size_t),
                ("up_proj_bytes", c_size_t)]


CHECKPOINT_FORMATS = {0: "ct_mxfp4", 1: "ct_nvfp4", 2: "modelopt_nvfp4", 3: "stacked"}


def _candidates():
    env = os.environ.get("K3KERNELS_LIB")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "_lib", "libk3.so")
    # a source checkout: python/k3kernels -> the repository's build folder
    yield os.path.join(here, "..", "..", "build", "libk3.so")


def load():
    tried = []
    for path in _candidates():
        path = os.path.normpath(path)
        if os.path.exists(path):
            lib = ctypes.CDLL(path)
            _declare(lib)
            return lib, path
        tried.append(path)
    raise ImportError("k3kernels: libk3.so not found (looked at %s); install the package with `pip install .` or set "
                      "K3KERNELS_LIB" % ", ".join(tried))


def _fastcall_candidates():
    env = os.environ.get("K3KERNELS_FASTCALL")
    if env:
        yield env, True
    here = os.path.dirname(os.path.abspath(__file__))
    suffix = importlib.machinery.EXTENSION_SUFFIXES
    for folder in (here, os.path.join(here, "..", "..", "build")):  # the installed package; a source checkout
        for s in suffix:
            yield os.path.join(folder, "_fastcall" + s), False


def load_fastcall():
    """The compiled run calls (k3kernels._fastcall, built beside libk3 when the Python headers are found), or None:
    the torch front end then calls the library through ctypes alone. K3KERNELS_FASTCALL names the module's file;
    a file named there that cannot be loaded, or whose struct layouts differ from the ctypes mirrors, raises
    ImportError (asked for explicitly: never dropped silently), K3KERNELS_FASTCALL=0 turns the module off."""
    if os.environ.get("K3KERNELS_FASTCALL") == "0":
        return None
    for path, asked in _fastcall_candidates():
        path = os.path.normpath(path)
        if not os.path.exists(path):
            if asked:
                raise ImportError("k3kernels: K3KERNELS_FASTCALL names %s, which does not exist" % path)
            continue
        try:
            spec = importlib.util.spec_from_file_location("k3kernels._fastcall", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            sizes = mod.layouts()
        except (ImportError, OSError, AttributeError) as e:
            if asked:
                raise ImportError("k3kernels: cannot load the compiled run calls %s: %s" % (path, e)) from e
            continue
        if sizes != {"k3_moe_weights": ctypes.sizeof(MoeWeights), "pointer": ctypes.sizeof(c_void_p)}:
            raise ImportError("k3kernels: %s was built from another k3.h than this package's (struct sizes %s); "
                              "rebuild the package from one source tree" % (path, sizes))
        return mod, path
    return None


def _declare(lib):
    P = ctypes.POINTER
    sigs = {
        "k3_version": (c_char_p, []),
        "k3_status_string": (c_char_p, [ctypes.c_int]),
        "k3_ctx_options_init": (None, [P(CtxOptions)]),
        "k3_ctx_create": (ctypes.c_int, [P(CtxOptions), P(c_void_p)]),
        "k3_ctx_destroy": (None, [c_void_p]),
        "k3_ctx_last_error": (c_char_p, [c_void_p]),
        "k3_ctx_backend": (ctypes.c_int, [c_void_p]),
        "k3_ctx_arch": (ctypes.c_int, [c_void_p, P(ArchInfo)]),
        "k3_table_name": (c_char_p, [ctypes.c_int]),
        "k3_act_desc_init": (None, [P(ActDesc), ctypes.c_int]),
        "k3_act_desc_k3": (None, [P(ActDesc)]),
        "k3_linear_desc_init": (None, [P(LinearDesc), c_int64, c_int64]),
        "k3_linear_plan_create": (ctypes.c_int, [c_void_p, P(LinearDesc), P(c_void_p)]),
        "k3_linear_plan_destroy": (None, [c_void_p]),
        "k3_linear_workspace_size": (ctypes.c_int, [c_void_p, P(c_size_t)]),
        "k3_linear_run": (ctypes.c_int, [c_void_p, c_int64, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_size_t,
                                         c_void_p]),
        "k3_router_desc_init": (None, [P(RouterDesc)]),
        "k3_router_plan_create": (ctypes.c_int, [c_void_p, P(RouterDesc), P(c_void_p)]),
        "k3_router_plan_destroy": (None, [c_void_p]),
        "k3_router_workspace_size": (ctypes.c_int, [c_void_p, P(c_size_t)]),
        "k3_router_run": (ctypes.c_int, [c_void_p, c_int64, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                                         c_size_t, c_void_p]),
        "k3_moe_desc_init": (None, [P(MoeDesc)]),
        "k3_moe_plan_create": (ctypes.c_int, [c_void_p, P(MoeDesc), P(c_void_p)]),
        "k3_moe_plan_destroy": (None, [c_void_p]),
        "k3_moe_workspace_size": (ctypes.c_int, [c_void_p, P(c_size_t)]),
        "k3_moe_run": (ctypes.c_int, [c_void_p, c_int64, c_void_p, c_void_p, c_void_p, P(MoeWeights), c_void_p,
                                      c_void_p, c_void_p, c_size_t, c_void_p]),
        "k3_kda_proj_desc_init": (None, [P(KdaProjDesc)]),
        "k3_kda_proj_plan_create": (ctypes.c_int, [c_void_p, P(KdaProjDesc), P(c_void_p)]),
        "k3_kda_proj_plan_destroy": (None, [c_void_p]),
        "k3_kda_proj_workspace_size": (ctypes.c_int, [c_void_p, P(c_size_t)]),
        "k3_kda_proj_run": (ctypes.c_int, [c_void_p, c_int64, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                                           c_void_p, c_void_p, c_size_t, c_void_p]),
        "k3_latent_moe_desc_init": (None, [P(LatentMoeDesc)]),
        "k3_latent_moe_plan_create": (ctypes.c_int, [c_void_p, P(LatentMoeDesc), P(c_void_p)]),
        "k3_latent_moe_plan_destroy": (None, [c_void_p]),
        "k3_latent_moe_workspace_size": (ctypes.c_int, [c_void_p, P(c_size_t)]),
        "k3_latent_moe_run": (ctypes.c_int, [c_void_p, c_int64, c_void_p, P(LatentMoeWeights), c_void_p, c_void_p,
                                             c_void_p, c_void_p, c_void_p, c_size_t, c_void_p]),
        "k3_checkpoint_open": (ctypes.c_int, [c_char_p, P(c_void_p), c_char_p, c_size_t]),
        "k3_checkpoint_close": (None, [c_void_p]),
        "k3_checkpoint_load_moe_layer": (ctypes.c_int, [c_void_p, c_int32, P(P(MoeLayer)), c_char_p, c_size_t]),
        "k3_moe_layer_free": (None, [P(MoeLayer)]),
        "k3_fp4_scale_bytes": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, c_int64, c_int64, P(c_size_t)]),
        "k3_fp4_quantize": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, c_int64, c_int64, c_int64, c_void_p, c_void_p,
                                           c_void_p, c_void_p]),
        "k3_fp4_dequantize": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, c_int64, c_int64, c_int64, c_void_p,
                                             c_void_p, c_void_p, c_void_p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def check_layouts(lib):
    """Reads back what the library's *_desc_init functions write: a mirror whose fields moved reads garbage."""
    m = MoeDesc()
    lib.k3_moe_desc_init(ctypes.byref(m))
    r = RouterDesc()
    lib.k3_router_desc_init(ctypes.byref(r))
    d = LinearDesc()
    lib.k3_linear_desc_init(ctypes.byref(d), 1536, 7168)
    o = CtxOptions()
    lib.k3_ctx_options_init(ctypes.byref(o))
    kd = KdaProjDesc()
    lib.k3_kda_proj_desc_init(ctypes.byref(kd))
    ld = LatentMoeDesc()
    lib.k3_latent_moe_desc_init(ctypes.byref(ld))
    ok = (m.num_experts, m.top_k, m.hidden, m.inter, m.format, m.max_tokens, m.force_shape, m.act.kind) == \
        (896, 16, 3584, 384, WEIGHT_NVFP4, 16, 0, ACT["situ"]) and abs(m.act.situ_beta - 4.0) < 1e-6 and \
        abs(m.act.situ_linear_beta - 25.0) < 1e-6 and \
        (r.num_experts, r.top_k, r.hidden, r.gate_dtype, r.renormalize, r.max_tokens) == (896, 16, 7168, DTYPE_BF16,
                                                                                           1, 16) and \
        abs(r.scaling_factor - 1.0) < 1e-6 and (d.n, d.k, d.max_m) == (1536, 7168, 16) and \
        (o.backend, o.device, o.sim_major, o.sim_sm_count) == (BACKEND_AUTO, 0, 0, 0) and \
        (kd.hidden, kd.local_heads, kd.head_dim, kd.fa_dim, kd.packed_rows, kd.max_tokens) == (7168, 12, 128, 128,
                                                                                                6288, 16) and \
        (ld.hidden, ld.router.num_experts, ld.experts.num_experts, ld.shared_inter, ld.max_tokens) == (7168, 896, 896,
                                                                                                     768, 16) and \
        abs(ld.rms_eps - 1e-5) < 1e-9 and ld.shared_act.kind == ACT["situ"] and \
        (ld.parallel.layout, ld.parallel.rank, ld.parallel.size, ld.parallel.tokens) == (0, 0, 1, 0)
    if not ok:
        raise ImportError("k3kernels: the ctypes mirrors of include/k3.h do not match this libk3 (rebuild the package "
                          "from the same source tree)")

