"""A minimal safetensors writer and reader for the tests (the format: an 8-byte little-endian header length, a JSON
header of {name: {dtype, shape, data_offsets}}, then the data), so that the tests hand `k3 run moe` the same bytes
the Python calls get."""
import json
import os
import struct

import numpy as np


def write(path, tensors):
    """tensors: {name: (dtype name, shape, numpy array whose bytes are the data)}; written to a temporary name in
    the same folder, then renamed."""
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, arr) in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": [int(s) for s in shape], "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


_NP = {"BF16": np.uint16, "F32": np.float32, "I32": np.int32, "U8": np.uint8, "F8_E4M3": np.uint8}


def read(path):
    """{name: numpy array of the raw values (BF16 as uint16 bits)}."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        out[name] = np.frombuffer(raw[base + a:base + b], dtype=_NP[h["dtype"]]).reshape(h["shape"])
    return out
