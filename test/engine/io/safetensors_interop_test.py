#!/bin/sh
""":"
# Shell part: Bazel runs this file as an sh_test; re-run it with the project's interpreter.
exec "${MAMMOTH_PYTHON:-/usr/bin/python3}" "$0" "$@"
"""

# Interop between Mammoth's safetensors reader/writer and the PyPI `safetensors` package.
#
#   safetensors_interop_test.py PATH/TO/safetensors_tool
#
# 1. Mammoth writes every dtype (safetensors_tool write); the reference Rust reader
#    (safetensors.deserialize) and safetensors' numpy front end must see the same names, dtypes,
#    shapes, bytes and metadata as this script computes independently.
# 2. safetensors.numpy writes every dtype numpy has, the reference serializer writes bf16 from
#    hand-made bit patterns; Mammoth (safetensors_tool check) must read them back exactly.
# The interpreter is $MAMMOTH_PYTHON (a venv with safetensors and numpy); a missing package is a
# failure, not a skip, so the check cannot silently disappear.

import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import safetensors
    from safetensors import deserialize, safe_open, serialize
    from safetensors.numpy import save_file
except ImportError as e:
    print(
        f"FAIL: {e}. The interpreter {sys.executable} lacks safetensors/numpy. Point "
        "MAMMOTH_PYTHON at a venv that has them, e.g.\n"
        "  /usr/bin/python3 -m venv --system-site-packages $HOME/.cache/mammoth/venv\n"
        "  $HOME/.cache/mammoth/venv/bin/pip install safetensors\n"
        "  export MAMMOTH_PYTHON=$HOME/.cache/mammoth/venv/bin/python",
        file=sys.stderr,
    )
    sys.exit(1)

# Mammoth's dtype short names -> safetensors names and numpy dtypes (None: numpy has none).
DTYPES = {
    "f32": ("F32", np.float32),
    "f64": ("F64", np.float64),
    "bf16": ("BF16", None),
    "f16": ("F16", np.float16),
    "i32": ("I32", np.int32),
    "i64": ("I64", np.int64),
    "u8": ("U8", np.uint8),
    "bool": ("BOOL", np.bool_),
}
SHAPES = {"main": (2, 3, 4), "scalar": (), "empty": (0, 2)}
METADATA = {"producer": "mammoth", "unicode": "\u00e9\u20ac"}

failures = []


def check(cond, message):
    if not cond:
        failures.append(message)


def expected_values(short, count):
    """The contents safetensors_tool writes (its float_value/int_value), as a numpy array."""
    i = np.arange(count, dtype=np.int64)
    k = (i * 37) % 101 - 50
    if short in ("f32", "f64", "bf16", "f16"):
        v = k / 8.0
        if count >= 4:
            v[0], v[1], v[2] = np.inf, -np.inf, -0.0
            if short in ("f32", "f64"):
                v[3] = 0.1
        if short == "bf16":
            # k/8 and the specials are exact in bf16: the top half of the float32 bits.
            return (v.astype(np.float32).view(np.uint32) >> 16).astype("<u2")
        return v.astype(DTYPES[short][1])
    if short == "i32":
        v = k * 40_000_000
        if count >= 4:
            v[0], v[1] = np.iinfo(np.int32).min, np.iinfo(np.int32).max
        return v.astype(np.int32)
    if short == "i64":
        v = k * 180_000_000_000_000_000
        if count >= 4:
            v[0], v[1] = np.iinfo(np.int64).min, np.iinfo(np.int64).max
        return v
    if short == "u8":
        return ((i * 37) % 256).astype(np.uint8)
    return (i % 3) == 0  # bool


def expected_array(short, shape):
    count = int(np.prod(shape)) if shape else 1
    return expected_values(short, count).reshape(shape)


def run_tool(tool, *args):
    result = subprocess.run([tool, *args], capture_output=True, text=True)
    if result.returncode != 0:
        print(f"FAIL: {tool} {' '.join(args)} exited {result.returncode}:\n{result.stderr}",
              file=sys.stderr)
        sys.exit(1)
    return result.stdout


def mammoth_writes_python_reads(tool, tmp):
    run_tool(tool, "write", tmp)
    path = os.path.join(tmp, "mammoth.safetensors")
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    check(n % 8 == 0, f"header length {n} is not a multiple of 8")

    # The reference Rust reader validates the whole file and gives raw bytes for every dtype.
    entries = dict(deserialize(data))
    want_names = {f"{s}.{k}" for s in DTYPES for k in SHAPES}
    check(set(entries) == want_names, f"names differ: {sorted(set(entries) ^ want_names)}")
    for short, (st_name, np_dtype) in DTYPES.items():
        for kind, shape in SHAPES.items():
            name = f"{short}.{kind}"
            if name not in entries:
                continue
            e = entries[name]
            want = expected_array(short, shape)
            check(e["dtype"] == st_name, f"{name}: dtype {e['dtype']} != {st_name}")
            check(list(e["shape"]) == list(shape), f"{name}: shape {e['shape']} != {shape}")
            check(bytes(e["data"]) == want.tobytes(), f"{name}: bytes differ")

    # The numpy front end (safe_open over mmap) for every dtype numpy has, and the metadata.
    with safe_open(path, framework="np") as f:
        check(f.metadata() == METADATA, f"metadata {f.metadata()} != {METADATA}")
        for short, (_, np_dtype) in DTYPES.items():
            if np_dtype is None:
                continue
            for kind, shape in SHAPES.items():
                name = f"{short}.{kind}"
                got = f.get_tensor(name)
                want = expected_array(short, shape)
                check(got.dtype == np.dtype(np_dtype), f"{name}: numpy dtype {got.dtype}")
                check(got.shape == shape, f"{name}: numpy shape {got.shape} != {shape}")
                check(got.tobytes() == want.tobytes(), f"{name}: numpy values differ")
    return len(entries)


def mammoth_reads(tool, path, want_tensors, want_metadata):
    """Runs `safetensors_tool check` on `path` and compares with {name: (st_dtype, array)}."""
    out = json.loads(run_tool(tool, "check", path))
    check(out["metadata"] == want_metadata,
          f"{path}: Mammoth read metadata {out['metadata']} != {want_metadata}")
    got = {t["name"]: t for t in out["tensors"]}
    check(set(got) == set(want_tensors),
          f"{path}: names differ: {sorted(set(got) ^ set(want_tensors))}")
    for name, (st_dtype, array) in want_tensors.items():
        if name not in got:
            continue
        t = got[name]
        check(t["dtype"] == st_dtype, f"{path}: {name}: dtype {t['dtype']} != {st_dtype}")
        check(tuple(t["shape"]) == array.shape, f"{path}: {name}: shape {t['shape']}")
        check(bytes.fromhex(t["hex"]) == array.tobytes(), f"{path}: {name}: bytes differ")
    # Mammoth lists tensors in file order: by data offset, whatever order the header uses.
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    by_offset = sorted(header, key=lambda k: tuple(header[k]["data_offsets"]))
    # Zero-size tensors share an offset with their neighbour; compare the non-empty ones.
    nonempty = [k for k in by_offset if header[k]["data_offsets"][0] != header[k]["data_offsets"][1]]
    got_nonempty = [t["name"] for t in out["tensors"] if t["hex"]]
    check(got_nonempty == nonempty, f"{path}: order {got_nonempty} != file order {nonempty}")
    return len(got)


def python_writes_mammoth_reads(tool, tmp):
    # Every dtype numpy has, through safetensors.numpy.save_file.
    tensors = {}
    for short, (st_name, np_dtype) in DTYPES.items():
        if np_dtype is None:
            continue
        for kind, shape in SHAPES.items():
            tensors[f"{short}.{kind}"] = (st_name, expected_array(short, shape))
    np_path = os.path.join(tmp, "numpy.safetensors")
    metadata = {"framework": "numpy", "unicode": "\u00e9\u20ac"}
    save_file({k: v for k, (_, v) in tensors.items()}, np_path, metadata=metadata)
    count = mammoth_reads(tool, np_path, tensors, metadata)

    # bf16: numpy has no such type, so hand the reference serializer the raw bit patterns.
    bf16 = {f"bf16.{kind}": ("BF16", expected_array("bf16", shape))
            for kind, shape in SHAPES.items()}
    specs = {}
    for name, (_, bits) in bf16.items():
        bits = bits.copy(order="C")  # (np.ascontiguousarray would turn a scalar into shape (1,))
        if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.7
            specs[name] = safetensors.TensorSpec(dtype="bfloat16", shape=list(bits.shape),
                                                 data_ptr=bits.ctypes.data, data_len=bits.nbytes)
        else:
            specs[name] = {"dtype": "bfloat16", "shape": list(bits.shape), "data": bits.tobytes()}
    bf16_path = os.path.join(tmp, "bf16.safetensors")
    with open(bf16_path, "wb") as f:
        f.write(bytes(serialize(specs, metadata=None)))
    count += mammoth_reads(tool, bf16_path, bf16, {})
    return count


def main():
    if len(sys.argv) != 2:
        print("usage: safetensors_interop_test.py PATH/TO/safetensors_tool", file=sys.stderr)
        return 2
    tool = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        n_written = mammoth_writes_python_reads(tool, tmp)
        n_read = python_writes_mammoth_reads(tool, tmp)
    if failures:
        print(f"FAIL ({len(failures)} problems, safetensors {safetensors.__version__}):",
              file=sys.stderr)
        for f in failures:
            print("  " + f, file=sys.stderr)
        return 1
    print(f"OK: safetensors {safetensors.__version__} (numpy {np.__version__}, "
          f"{sys.executable}) read {n_written} tensors Mammoth wrote; Mammoth read "
          f"{n_read} tensors safetensors wrote")
    return 0


if __name__ == "__main__":
    sys.exit(main())
