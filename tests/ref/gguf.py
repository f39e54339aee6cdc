"""Minimal GGUF (v2/v3) reader for the Python reference implementation.

What it is for: reading llama.cpp GGUF files (metadata of every type, the
tensor table, F32/F16/BF16 tensor data) so that tests/ref/qwen3moe.py can run a
forward pass that shares no code with the C engine.
What it is not: a validator or a writer, and it does not dequantise quantised
types (Q8_0, Q4_K, ...); asking for such a tensor raises GGUFError.

Layout notes (from the GGUF specification, ggml/docs/gguf.md):
  header   : magic "GGUF", u32 version, u64 n_tensors, u64 n_kv   (v2/v3)
  metadata : n_kv x (string key, u32 value type, value)
  tensors  : n_tensors x (string name, u32 n_dims, u64 ne[n_dims],
                          u32 ggml type, u64 offset relative to data start)
  data     : starts at the first multiple of general.alignment (default 32)
             after the tensor table.
A string is a u64 byte length followed by UTF-8 bytes.  ggml's ne[0] is the
contiguous dimension, so the numpy shape is the reversed ne.
"""

import struct
import sys

try:
    import numpy as np
except ImportError:  # the reference must say clearly what is missing
    sys.exit("error: numpy is required (Debian: apt-get install python3-numpy; "
             "run with /usr/bin/python3)")

# GGUF metadata value types.
_U8, _I8, _U16, _I16, _U32, _I32, _F32, _BOOL, _STR, _ARR, _U64, _I64, _F64 = range(13)

_SCALAR_FMT = {
    _U8: "<B", _I8: "<b", _U16: "<H", _I16: "<h", _U32: "<I", _I32: "<i",
    _F32: "<f", _BOOL: "<?", _U64: "<Q", _I64: "<q", _F64: "<d",
}

# ggml tensor types this reader can turn into arrays (id -> name, numpy dtype).
GGML_F32, GGML_F16, GGML_BF16 = 0, 1, 30
_GGML_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
    9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
    15: "Q8_K", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 30: "BF16",
}
_PLAIN_DTYPES = {GGML_F32: np.dtype("<f4"), GGML_F16: np.dtype("<f2"),
                 GGML_BF16: np.dtype("<u2")}


class GGUFError(Exception):
    """The file is not a GGUF this reader understands, or a request is invalid."""


def ggml_type_name(type_id):
    return _GGML_NAMES.get(type_id, "type%d" % type_id)


class TensorInfo:
    """One entry of the tensor table; ne is in ggml order (ne[0] contiguous)."""

    def __init__(self, name, ne, type_id, offset):
        self.name = name
        self.ne = tuple(ne)
        self.type_id = type_id
        self.offset = offset  # bytes, relative to GGUFFile.data_offset

    @property
    def type_name(self):
        return ggml_type_name(self.type_id)

    @property
    def shape(self):
        """numpy (row-major) shape: the reversed ne."""
        return tuple(reversed(self.ne))


class _Cursor:
    """Sequential little-endian reader over a bytes-like object."""

    def __init__(self, buf, path):
        self.buf = buf
        self.pos = 0
        self.path = path

    def take(self, n):
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError("%s: truncated at byte %d (wanted %d more bytes)"
                            % (self.path, self.pos, n))
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        n = self.scalar("<Q")
        return bytes(self.take(n)).decode("utf-8", errors="replace")

    def value(self, vtype):
        if vtype in _SCALAR_FMT:
            return self.scalar(_SCALAR_FMT[vtype])
        if vtype == _STR:
            return self.string()
        if vtype == _ARR:
            etype = self.scalar("<I")
            n = self.scalar("<Q")
            if etype in _SCALAR_FMT and etype != _BOOL:
                # Numeric arrays can be long (token types, scores): read in one go.
                dt = np.dtype(_SCALAR_FMT[etype])
                raw = self.take(n * dt.itemsize)
                return np.frombuffer(raw, dtype=dt, count=n).tolist()
            return [self.value(etype) for _ in range(n)]  # strings, bools, nested arrays
        raise GGUFError("%s: unknown metadata value type %d at byte %d"
                        % (self.path, vtype, self.pos))


class GGUFFile:
    """A GGUF file opened read-only through np.memmap.

    Attributes: version, metadata (dict key -> python value; arrays are lists),
    tensors (dict name -> TensorInfo, in file order), alignment, data_offset.
    """

    def __init__(self, path):
        self.path = path
        self._map = np.memmap(path, dtype=np.uint8, mode="r")
        cur = _Cursor(self._map, path)
        if bytes(cur.take(4)) != b"GGUF":
            raise GGUFError("%s: not a GGUF file (bad magic)" % path)
        self.version = cur.scalar("<I")
        if self.version not in (2, 3):
            raise GGUFError("%s: GGUF version %d not supported (2 or 3 only)"
                            % (path, self.version))
        n_tensors = cur.scalar("<Q")
        n_kv = cur.scalar("<Q")

        self.metadata = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.scalar("<I")
            self.metadata[key] = cur.value(vtype)

        self.tensors = {}
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar("<I")
            ne = [cur.scalar("<Q") for _ in range(n_dims)]
            type_id = cur.scalar("<I")
            offset = cur.scalar("<Q")
            if name in self.tensors:
                raise GGUFError("%s: duplicate tensor %r" % (path, name))
            self.tensors[name] = TensorInfo(name, ne, type_id, offset)

        self.alignment = int(self.metadata.get("general.alignment", 32))
        if self.alignment <= 0:
            raise GGUFError("%s: bad general.alignment %d" % (path, self.alignment))
        a = self.alignment
        self.data_offset = (cur.pos + a - 1) // a * a

    def get(self, key, default=None):
        return self.metadata.get(key, default)

    def require(self, key):
        if key not in self.metadata:
            raise GGUFError("%s: missing metadata key %r" % (self.path, key))
        return self.metadata[key]

    def tensor(self, name, dtype=np.float32):
        """Returns tensor `name` as a numpy array of shape reversed(ne).

        F32 is returned as a read-only view of the file when dtype is float32;
        F16 and BF16 are widened exactly (BF16 bits become the high half of an
        IEEE float32).
        """
        info = self.tensors.get(name)
        if info is None:
            raise GGUFError("%s: no tensor %r" % (self.path, name))
        if info.type_id not in _PLAIN_DTYPES:
            raise GGUFError("%s: tensor %r has type %s; the reference reads only "
                            "F32, F16 and BF16" % (self.path, name, info.type_name))
        src_dt = _PLAIN_DTYPES[info.type_id]
        count = int(np.prod(info.ne, dtype=np.int64)) if info.ne else 1
        start = self.data_offset + info.offset
        if start + count * src_dt.itemsize > len(self._map):
            raise GGUFError("%s: tensor %r runs past the end of the file"
                            % (self.path, name))
        raw = np.frombuffer(self._map, dtype=src_dt, count=count, offset=start)
        if info.type_id == GGML_BF16:
            arr = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            arr = raw
        return arr.reshape(info.shape).astype(dtype, copy=False)


def _main(argv):
    """Debug aid: `python3 gguf.py FILE` lists metadata and tensors."""
    if len(argv) != 2:
        sys.exit("usage: %s FILE.gguf" % argv[0])
    g = GGUFFile(argv[1])
    print("GGUF v%d, alignment %d, data at %d" % (g.version, g.alignment, g.data_offset))
    for k, v in g.metadata.items():
        s = repr(v)
        print("  %s = %s" % (k, s if len(s) < 100 else s[:97] + "..."))
    for t in g.tensors.values():
        print("  %-32s %-5s ne=%s" % (t.name, t.type_name, list(t.ne)))


if __name__ == "__main__":
    _main(sys.argv)
