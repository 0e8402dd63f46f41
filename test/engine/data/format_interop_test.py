#!/usr/bin/env python3
"""Interop test for the token file formats, against numpy code written here from the format
descriptions (not from llm.c's or Megatron's code):

  llm.c token shard: int32 header[256] = {20240520, 1, num_tokens, 0...}, then uint16 tokens.
  Megatron indexed dataset: PREFIX.idx = b"MMIDIDX\\x00\\x00", u64 version 1, u8 dtype code,
  u64 sequence count S, u64 document-index count D, int32[S] lengths, int64[S] byte pointers
  into PREFIX.bin, int64[D] document indices (0 .. S); PREFIX.bin = the elements.

Files written by numpy must read identically in C++ and the other way round, byte for byte,
and corrupt files must be rejected with a message naming the file.

Usage: format_interop_test.py PATH/TO/data_tool      (needs numpy)
"""
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError as e:
    sys.exit(f"FAIL: numpy is not importable by {sys.executable} ({e})")

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def tool(exe, *args, expect_ok=True):
    res = subprocess.run([exe, *args], capture_output=True, text=True)
    if expect_ok and res.returncode != 0:
        fail(f"data_tool {' '.join(args)} exited {res.returncode}: {res.stderr}")
    if not expect_ok and res.returncode == 0:
        fail(f"data_tool {' '.join(args)} accepted a corrupt file")
    return res


def np_write_shard(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def np_read_shard(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        tokens = np.frombuffer(f.read(), dtype=np.uint16)
    if header[0] != 20240520 or header[1] != 1 or header[2] != len(tokens):
        fail(f"shard header {header[:3]} disagrees with {len(tokens)} tokens")
    if np.any(header[3:] != 0):
        fail("shard header has nonzero reserved ints")
    return tokens.tolist()


def np_write_indexed(prefix, code, docs):
    """docs: list of documents, each a list of sequences (lists of ints)."""
    dt = DTYPES[code]
    lengths, pointers, doc_idx, offset = [], [], [0], 0
    with open(prefix + ".bin", "wb") as f:
        for doc in docs:
            for seq in doc:
                data = np.asarray(seq, dtype=dt).tobytes()
                f.write(data)
                lengths.append(len(seq))
                pointers.append(offset)
                offset += len(data)
            doc_idx.append(len(lengths))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(np.asarray(lengths, dtype=np.int32).tobytes())
        f.write(np.asarray(pointers, dtype=np.int64).tobytes())
        f.write(np.asarray(doc_idx, dtype=np.int64).tobytes())


def np_read_indexed(prefix):
    with open(prefix + ".idx", "rb") as f:
        raw = f.read()
    if raw[:9] != b"MMIDIDX\x00\x00":
        fail(f"{prefix}.idx: bad magic {raw[:9]!r}")
    version, = struct.unpack_from("<Q", raw, 9)
    code, = struct.unpack_from("<B", raw, 17)
    s, d = struct.unpack_from("<QQ", raw, 18)
    if version != 1:
        fail(f"{prefix}.idx: version {version}")
    if len(raw) != 34 + 12 * s + 8 * d:
        fail(f"{prefix}.idx: {len(raw)} bytes for {s} sequences and {d} document indices")
    lengths = np.frombuffer(raw, dtype=np.int32, count=s, offset=34)
    pointers = np.frombuffer(raw, dtype=np.int64, count=s, offset=34 + 4 * s)
    doc_idx = np.frombuffer(raw, dtype=np.int64, count=d, offset=34 + 12 * s)
    bin_data = open(prefix + ".bin", "rb").read()
    dt = DTYPES[code]
    seqs = [np.frombuffer(bin_data, dtype=dt, count=int(n), offset=int(p)).tolist()
            for n, p in zip(lengths, pointers)]
    docs = [seqs[doc_idx[j]:doc_idx[j + 1]] for j in range(d - 1)]
    if doc_idx[0] != 0 or doc_idx[-1] != s:
        fail(f"{prefix}.idx: document indices {doc_idx.tolist()} do not span 0..{s}")
    expected_ptr = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))[:-1]]) * np.dtype(dt).itemsize
    if s and not np.array_equal(pointers, expected_ptr):
        fail(f"{prefix}.idx: pointers {pointers.tolist()} are not packed back to back")
    return code, docs


def spec_lines(docs):
    lines = []
    for doc in docs:
        for seq in doc:
            lines.append(" ".join(map(str, seq)))
        lines.append("doc")
    return "\n".join(lines) + "\n"


def main():
    exe = sys.argv[1]
    rng = np.random.default_rng(20240520)
    with tempfile.TemporaryDirectory() as tmp:
        # --- llm.c shards, both directions.
        tokens = rng.integers(0, 65536, size=5000).tolist() + [0, 65535, 50256]
        np_path = os.path.join(tmp, "np.bin")
        np_write_shard(np_path, tokens)
        got = [int(x) for x in tool(exe, "shard-dump", np_path).stdout.split()]
        if got != tokens:
            fail("C++ reads a numpy-written shard differently")
        ids_path = os.path.join(tmp, "ids.txt")
        with open(ids_path, "w") as f:
            f.write(" ".join(map(str, tokens)))
        cc_path = os.path.join(tmp, "cc.bin")
        tool(exe, "shard-write", cc_path, ids_path)
        if np_read_shard(cc_path) != tokens:
            fail("numpy reads a C++-written shard differently")
        if open(cc_path, "rb").read() != open(np_path, "rb").read():
            fail("C++ and numpy shards of the same tokens differ byte for byte")
        print(f"shards: {len(tokens)} tokens identical both ways, files byte-identical")

        # Corrupt shards: bad magic, bad version, truncated.
        good = open(np_path, "rb").read()
        for name, data in [("magic", struct.pack("<i", 1234) + good[4:]),
                           ("version", good[:4] + struct.pack("<i", 2) + good[8:]),
                           ("truncated", good[:-7])]:
            bad = os.path.join(tmp, f"bad_{name}.bin")
            open(bad, "wb").write(data)
            res = tool(exe, "shard-dump", bad, expect_ok=False)
            if bad not in res.stderr:
                fail(f"error for a shard with bad {name} does not name the file: {res.stderr}")
        print("shards: bad magic, version and truncation rejected, naming the file")

        # --- Megatron indexed datasets, every integer dtype, both directions.
        for code, dt in DTYPES.items():
            info = np.iinfo(dt)
            lo, hi = max(info.min, -2**31), min(info.max, 2**31 - 1)
            docs = []
            for _ in range(7):
                doc = [rng.integers(lo, hi, size=int(rng.integers(0, 40)), endpoint=True).tolist()
                       for _ in range(int(rng.integers(1, 4)))]
                docs.append(doc)
            docs[0][0] = [lo, hi, 0] if lo < 0 else [lo, hi]
            prefix = os.path.join(tmp, f"np_{code}")
            np_write_indexed(prefix, code, docs)
            out = tool(exe, "indexed-dump", prefix).stdout
            if out != f"dtype {code}\n" + spec_lines(docs):
                fail(f"C++ reads a numpy-written indexed dataset (dtype {code}) differently")
            spec = os.path.join(tmp, f"spec_{code}.txt")
            open(spec, "w").write(spec_lines(docs))
            cc_prefix = os.path.join(tmp, f"cc_{code}")
            tool(exe, "indexed-write", cc_prefix, str(code), spec)
            got_code, got_docs = np_read_indexed(cc_prefix)
            if got_code != code or got_docs != docs:
                fail(f"numpy reads a C++-written indexed dataset (dtype {code}) differently")
            for ext in (".idx", ".bin"):
                if open(cc_prefix + ext, "rb").read() != open(prefix + ext, "rb").read():
                    fail(f"C++ and numpy {ext} files (dtype {code}) differ byte for byte")
        print(f"indexed datasets: dtypes {sorted(DTYPES)} identical both ways, files byte-identical")

        # Corrupt index: bad magic, truncated index, truncated .bin.
        prefix = os.path.join(tmp, "np_8")
        idx, binf = open(prefix + ".idx", "rb").read(), open(prefix + ".bin", "rb").read()
        for name, idx_data, bin_data in [("magic", b"MMIDIDY" + idx[7:], binf),
                                         ("truncated_idx", idx[:-3], binf),
                                         ("truncated_bin", idx, binf[:-2])]:
            bad = os.path.join(tmp, "bad_" + name)
            open(bad + ".idx", "wb").write(idx_data)
            open(bad + ".bin", "wb").write(bin_data)
            res = tool(exe, "indexed-dump", bad, expect_ok=False)
            if bad not in res.stderr:
                fail(f"error for index with {name} does not name the file: {res.stderr}")
        print("indexed datasets: bad magic and truncation rejected, naming the file")
    print("PASS")


if __name__ == "__main__":
    main()
