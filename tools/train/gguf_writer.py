"""A GGUF v3 writer: metadata in the order it is added, tensors in the order
they are added, every tensor's data aligned to general.alignment (32) and
padded with zeros to it, as llama.cpp's gguf writer lays files out.
Not a reader, and it knows only the tensor types the exporter writes
(F32, F16, BF16).

File layout: "GGUF", u32 version, u64 n_tensors, u64 n_kv; the kvs (string
key, u32 type, value); the tensor infos (string name, u32 n_dims, u64 ne[],
u32 type, u64 offset from the start of the data); zero padding to the
alignment; the data. Strings are a u64 byte count and UTF-8 bytes. ggml's
ne[0] is the contiguous dimension: ne is the reversed numpy shape.
"""

import struct

import numpy as np

ALIGNMENT = 32

# GGUF metadata value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = \
    range(13)
_SCALAR = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
           FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}

# ggml tensor types
GGML_F32, GGML_F16, GGML_BF16 = 0, 1, 30


def _string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype, v):
    if vtype == STRING:
        return _string(v)
    return struct.pack(_SCALAR[vtype], v)


def f32_to_bf16_bits(x):
    """float32 array -> uint16 bfloat16 bits, rounded to nearest even (NaN
    kept quiet), as ggml's ggml_compute_fp32_to_bf16 does."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = ((u[nan] >> 16) | 64).astype(np.uint16)
    return r


def encode_tensor(x, ggml_type):
    """numpy float array -> bytes in ggml_type."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if ggml_type == GGML_F32:
        return x.astype("<f4").tobytes()
    if ggml_type == GGML_F16:
        return x.astype("<f2").tobytes()  # IEEE round to nearest even, as ggml
    if ggml_type == GGML_BF16:
        return f32_to_bf16_bits(x).astype("<u2").tobytes()
    raise ValueError("unsupported ggml type %d" % ggml_type)


class Writer:
    def __init__(self):
        self.kvs = []       # (key, bytes of type + value)
        self.tensors = []   # (name, ne, ggml_type, data bytes)
        self.keys = set()

    def _add(self, key, payload):
        if key in self.keys:
            raise ValueError("key %r added twice" % key)
        self.keys.add(key)
        self.kvs.append((key, payload))

    def add(self, key, vtype, value):
        self._add(key, struct.pack("<I", vtype) + _value(vtype, value))

    def add_u32(self, key, v):
        self.add(key, UINT32, int(v))

    def add_f32(self, key, v):
        self.add(key, FLOAT32, float(v))

    def add_bool(self, key, v):
        self.add(key, BOOL, bool(v))

    def add_str(self, key, v):
        self.add(key, STRING, v)

    def add_array(self, key, vtype, values):
        body = b"".join(_value(vtype, v) for v in values)
        self._add(key, struct.pack("<IIQ", ARRAY, vtype, len(values)) + body)

    def add_tensor(self, name, x, ggml_type):
        """x: numpy array in torch (row-major) shape; stored with ne = reversed shape."""
        ne = list(reversed(x.shape))
        if not 1 <= len(ne) <= 4:
            raise ValueError("tensor %r has %d dimensions" % (name, len(ne)))
        self.tensors.append((name, ne, ggml_type, encode_tensor(x, ggml_type)))

    def to_bytes(self):
        head = [b"GGUF", struct.pack("<IQQ", 3, len(self.tensors), len(self.kvs))]
        for key, payload in self.kvs:
            head.append(_string(key) + payload)
        offset = 0
        for name, ne, t, data in self.tensors:
            head.append(_string(name) + struct.pack("<I", len(ne)))
            head.append(b"".join(struct.pack("<Q", n) for n in ne))
            head.append(struct.pack("<IQ", t, offset))
            offset += -(-len(data) // ALIGNMENT) * ALIGNMENT
        out = b"".join(head)
        if not self.tensors:
            return out
        out += b"\0" * (-len(out) % ALIGNMENT)
        body = []
        for _, _, _, data in self.tensors:
            body.append(data + b"\0" * (-len(data) % ALIGNMENT))
        return out + b"".join(body)

    def write(self, path):
        with open(path, "wb") as f:
            f.write(self.to_bytes())
