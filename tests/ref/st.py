"""Minimal safetensors reader and writer (json + numpy only; no `safetensors` package needed).

Format: an 8-byte little-endian header length N, N bytes of JSON header, then the data buffer.
The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
relative to the data buffer) and may hold "__metadata__": {str: str}. The writer lays tensors out
by descending element size (so every tensor is aligned to its element size), pads the header with
spaces to a multiple of 8 bytes and, like worker/formats/safetensors.c, can add "cephalo.crc32" (CRC-32 of
the data buffer), which the reader verifies when present.

    tensors, meta = read("init.safetensors")      # {name: np.ndarray}, {key: str}
    write("out.safetensors", {"w": np.zeros((2, 3), np.float32)}, {"k": "v"})
"""
import json
import struct
import zlib

import needs  # noqa: E402
needs.modules("numpy")
import numpy as np

CRC_KEY = "cephalo.crc32"

_DTYPES = {
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "I16": np.int16,
    "U16": np.uint16,
    "F16": np.float16,
    "I32": np.int32,
    "U32": np.uint32,
    "F32": np.float32,
    "I64": np.int64,
    "U64": np.uint64,
    "F64": np.float64,
}
_NAMES = {np.dtype(v).str: k for k, v in _DTYPES.items()}


class FormatError(Exception):
    pass


def _bf16_to_f32(raw):
    u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return u.view(np.float32)


def read(path):
    """Returns ({name: numpy array (a copy, native byte order)}, {metadata key: value})."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise FormatError(f"{path}: too short for a safetensors file ({len(blob)} bytes)")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise FormatError(f"{path}: header length {n} exceeds the file ({len(blob)} bytes)")
    try:
        header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{path}: bad header JSON: {e}") from None
    data = memoryview(blob)[8 + n :]
    meta = header.pop("__metadata__", None) or {}
    if CRC_KEY in meta:
        crc = "%08x" % (zlib.crc32(data) & 0xFFFFFFFF)
        if crc != meta[CRC_KEY].lower():
            raise FormatError(f"{path}: data CRC-32 {crc} != {CRC_KEY} {meta[CRC_KEY]}")
    out = {}
    for name, t in header.items():
        dt, shape, (a, b) = t["dtype"], [int(s) for s in t["shape"]], t["data_offsets"]
        if not 0 <= a <= b <= len(data):
            raise FormatError(f"{path}: tensor {name}: offsets [{a}, {b}] outside the data")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        raw = bytes(data[a:b])
        if dt == "BF16":
            if b - a != 2 * count:
                raise FormatError(f"{path}: tensor {name}: {b - a} bytes for {count} BF16")
            arr = _bf16_to_f32(raw)
        elif dt in _DTYPES:
            np_dt = np.dtype(_DTYPES[dt]).newbyteorder("<")
            if b - a != count * np_dt.itemsize:
                raise FormatError(f"{path}: tensor {name}: {b - a} bytes for {count} {dt}")
            arr = np.frombuffer(raw, dtype=np_dt).astype(_DTYPES[dt])
        else:
            raise FormatError(f"{path}: tensor {name}: unsupported dtype {dt}")
        out[name] = arr.reshape(shape)
    return out, meta


def write(path, tensors, metadata=None, crc=True):
    """Writes {name: array-like} with optional {str: str} metadata (values json-dumped if not str)."""
    arrs = {}
    for name, a in tensors.items():
        a = np.ascontiguousarray(np.asarray(a))
        if a.dtype.newbyteorder("<").str not in _NAMES and a.dtype.str not in _NAMES:
            raise FormatError(f"tensor {name}: unsupported dtype {a.dtype}")
        arrs[name] = a.astype(a.dtype.newbyteorder("<"), copy=False)
    # descending element size, insertion order within one size
    order = sorted(arrs, key=lambda k: -arrs[k].dtype.itemsize)
    header, chunks, off = {}, [], 0
    for name in order:
        a = arrs[name]
        raw = a.tobytes()
        header[name] = {
            "dtype": _NAMES[a.dtype.str],
            "shape": list(a.shape),
            "data_offsets": [off, off + len(raw)],
        }
        chunks.append(raw)
        off += len(raw)
    data = b"".join(chunks)
    meta = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in (metadata or {}).items()}
    if crc:
        meta[CRC_KEY] = "%08x" % (zlib.crc32(data) & 0xFFFFFFFF)
    if meta:
        header = {"__metadata__": meta, **header}
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        f.write(data)
