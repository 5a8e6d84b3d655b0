"""The ctypes mirrors of include/k3.h's structs have the C layout: a C program built here from the header prints
each struct's size and every field's offset, and the mirrors must agree. A mirror shorter than its C struct lets
the library's *_init write past the Python object; a shifted field passes the wrong value. Skipped without a C
compiler."""
import ctypes
import os
import shutil
import subprocess

import pytest

from k3kernels import _capi as C

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# mirror class -> the C type it mirrors (its fields are checked by the names the mirror gives them)
STRUCTS = {
    C.CtxOptions: "k3_ctx_options",
    C.ArchInfo: "k3_arch_info",
    C.ActDesc: "k3_act_desc",
    C.LinearDesc: "k3_linear_desc",
    C.RouterDesc: "k3_router_desc",
    C.MoeDesc: "k3_moe_desc",
    C.KdaProjDesc: "k3_kda_proj_desc",
    C.MoeWeights: "k3_moe_weights",
    C.ParallelDesc: "k3_parallel_desc",
    C.LatentMoeDesc: "k3_latent_moe_desc",
    C.LatentMoeWeights: "k3_latent_moe_weights",
    C.MoeLayer: "k3_moe_layer",
}


def _c_layout(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler to read the C layout with")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "k3.h"', "int main(void) {"]
    for cls, ctype in STRUCTS.items():
        lines.append('    printf("%s __sizeof__ %%zu\\n", sizeof(%s));' % (ctype, ctype))
        for name, _ in cls._fields_:
            lines.append('    printf("%s %s %%zu\\n", offsetof(%s, %s));' % (ctype, name, ctype, name))
    lines += ["    return 0;", "}"]
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text("\n".join(lines) + "\n")
    r = subprocess.run([cc, "-std=c11", "-I", os.path.join(ROOT, "include"), str(src), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, "a mirror names a field the C struct does not have:\n" + r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    got = {}
    for line in out.splitlines():
        ctype, field, value = line.split()
        got[(ctype, field)] = int(value)
    return got


def test_ctypes_mirrors_have_the_c_layout(tmp_path):
    got = _c_layout(tmp_path)
    for cls, ctype in STRUCTS.items():
        assert ctypes.sizeof(cls) == got[(ctype, "__sizeof__")], \
            "%s: the mirror is %d bytes, the C struct %d" % (ctype, ctypes.sizeof(cls),
                                                             got[(ctype, "__sizeof__")])
        for name, _ in cls._fields_:
            assert getattr(cls, name).offset == got[(ctype, name)], \
                "%s.%s: offset %d in the mirror, %d in C" % (ctype, name, getattr(cls, name).offset,
                                                            got[(ctype, name)])
