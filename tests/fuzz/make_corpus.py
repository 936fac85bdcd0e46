#!/usr/bin/env python3
"""Writes the GGUF reader's corpus: malformed files with the error each must give, and a few valid seeds.

Output: tests/fuzz/corpus/*.gguf and tests/fuzz/corpus/expected.txt, one line per file:
    <file name> <status name> <substring the error message must contain>
(the substring is the rest of the line; empty for OK). tests/core/test_gguf_corpus.cpp checks them,
and scripts/fuzz.sh starts libFuzzer from them. Deterministic: run it again and nothing changes.

Usage: python3 tests/fuzz/make_corpus.py [output dir]   (default: corpus/ next to this script)
"""
import os
import struct
import sys

import numpy as np

# GGUF metadata value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
# ggml tensor type ids and (block size, bytes per block) of the ones the valid seeds use.
T_F32, T_F16, T_Q4_0, T_Q8_0, T_BF16, T_MXFP4 = 0, 1, 2, 8, 30, 39
BLOCKS = {T_F32: (1, 4), T_F16: (1, 2), T_Q4_0: (32, 18), T_Q8_0: (32, 34), T_BF16: (1, 2), T_MXFP4: (32, 17)}

SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
              U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s):
    b = s.encode() if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def value(vtype, v):
    """Encodes a value of `vtype` (without its type tag). Arrays: v = (elem_type, [elements])."""
    if vtype == STRING:
        return gstr(v)
    if vtype == ARRAY:
        et, elems = v
        return struct.pack("<IQ", et, len(elems)) + b"".join(value(et, e) for e in elems)
    return struct.pack(SCALAR_FMT[vtype], v)


def kv(key, vtype, v):
    return gstr(key) + struct.pack("<I", vtype) + value(vtype, v)


def tinfo(name, ne, ttype, offset):
    return gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) + \
        struct.pack("<IQ", ttype, offset)


def header(n_tensors, n_kv, version=3, magic=b"GGUF"):
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


def n_bytes(ne, ttype):
    bs, bb = BLOCKS[ttype]
    n = 1
    for d in ne[1:]:
        n *= d
    return ne[0] // bs * bb * n


def gguf(kvs, tensors, version=3, alignment=32, data=None, data_len=None):
    """A whole file. kvs: encoded KVs; tensors: (name, ne, type, offset or None for 'next aligned').
    data: tensor data bytes (default: random bytes of the needed length)."""
    infos, off = [], 0
    for name, ne, tt, offset in tensors:
        if offset is None:
            offset = off
        infos.append(tinfo(name, ne, tt, offset))
        if tt in BLOCKS:
            off = max(off, offset + n_bytes(ne, tt))
            off = (off + alignment - 1) // alignment * alignment
    out = header(len(tensors), len(kvs), version) + b"".join(kvs) + b"".join(infos)
    out += b"\0" * ((-len(out)) % alignment)
    if data is None:
        data = RNG.integers(0, 256, size=off if data_len is None else data_len, dtype=np.uint8).tobytes()
    return out + data


RNG = np.random.default_rng(20240611)
ARCH = kv("general.architecture", STRING, "qwen3moe")
ALIGN64 = kv("general.alignment", U32, 64)


def cases():
    """(file name, expected status, message substring, bytes)."""
    c = []

    def add(name, status, substring, data):
        c.append((name, status, substring, data))

    one_f32 = [("w", [8], T_F32, None)]

    # --- valid seeds ---
    all_kvs = [
        ARCH,
        kv("general.name", STRING, "tiny"),
        kv("t.u8", U8, 200), kv("t.i8", I8, -100), kv("t.u16", U16, 60000), kv("t.i16", I16, -30000),
        kv("t.u32", U32, 4000000000), kv("t.i32", I32, -2000000000), kv("t.f32", F32, 1.5),
        kv("t.bool", BOOL, 1), kv("t.u64", U64, 2**64 - 1), kv("t.i64", I64, -2**62), kv("t.f64", F64, -2.25),
        kv("tokenizer.ggml.tokens", ARRAY, (STRING, ["a", "bc", "", "\u00e9"])),
        kv("tokenizer.ggml.scores", ARRAY, (F32, [0.5, -1.0, 2.0])),
        kv("t.nested", ARRAY, (ARRAY, [(U8, [1, 2]), (U8, []), (U8, [3])])),
        kv("t.empty", ARRAY, (I64, [])),
    ]
    add("valid_v3_all_types.gguf", "OK", "", gguf(all_kvs, [
        ("token_embd.weight", [64, 3], T_Q8_0, None), ("blk.0.attn_norm.weight", [64], T_F32, None),
        ("blk.0.ffn_up_exps.weight", [64, 2, 4], T_MXFP4, None), ("blk.0.ffn_gate_exps.weight", [32, 2, 4], T_Q4_0, None),
        ("blk.0.attn_q.weight", [16, 16], T_F16, None), ("output.weight", [16, 3, 1, 2], T_BF16, None)]))
    add("valid_v2_small.gguf", "OK", "", gguf([ARCH, kv("qwen3moe.block_count", U32, 1)],
                                              [("a", [4, 4], T_F32, None), ("b", [32], T_Q8_0, None)], version=2))
    # Alignment 64, an empty tensor, tensors stored in the reverse order of their infos, non-UTF-8 bytes.
    add("valid_align64_odd.gguf", "OK", "", gguf(
        [ALIGN64, kv("t.latin1", STRING, b"\xe9t\xe9\xff"), kv("t.bool2", BOOL, 2)],
        [("z\xff".encode("latin1"), [16], T_F32, 64), ("empty", [0, 5], T_F16, 0), ("y", [16], T_F32, 0)],
        alignment=64))
    add("valid_no_tensors.gguf", "OK", "", header(0, 1) + ARCH)

    # --- header ---
    add("empty.gguf", "DATA_CORRUPT", "file too small for a GGUF header", b"")
    add("short_header.gguf", "DATA_CORRUPT", "file too small for a GGUF header", header(0, 0)[:20])
    add("bad_magic.gguf", "DATA_CORRUPT", "header.magic: expected \"GGUF\", found \"GGML\"",
        header(0, 1, magic=b"GGML") + ARCH)
    add("version0.gguf", "DATA_CORRUPT", "header.version: 0 is not", header(0, 1, version=0) + ARCH)
    add("version1.gguf", "UNIMPLEMENTED", "GGUF version 1 is not supported", header(0, 1, version=1) + ARCH)
    add("version99.gguf", "UNIMPLEMENTED", "GGUF version 99 is not supported", header(0, 1, version=99) + ARCH)
    add("big_endian_v3.gguf", "UNIMPLEMENTED", "big-endian", b"GGUF" + struct.pack(">IQQ", 3, 0, 1) + ARCH)
    add("huge_tensor_count.gguf", "DATA_CORRUPT", "header.tensor_count: 4611686018427387904",
        header(2**62, 1) + ARCH)
    add("huge_kv_count.gguf", "DATA_CORRUPT", "header.kv_count: 1099511627776", header(0, 2**40) + ARCH)
    add("negative_kv_count.gguf", "DATA_CORRUPT", "header.kv_count", header(0, 2**64 - 1) + ARCH)

    # --- metadata ---
    add("key_length_past_eof.gguf", "DATA_CORRUPT", "metadata[0].key: string length 9223372036854775808",
        header(0, 1) + struct.pack("<Q", 2**63) + b"general.architecture" + b"\0" * 16)
    add("empty_key.gguf", "DATA_CORRUPT", "metadata[1].key: empty key", header(0, 2) + ARCH + kv("", U32, 1))
    add("string_past_eof.gguf", "DATA_CORRUPT", "metadata[1] 'general.name': string length 1000",
        header(0, 2) + ARCH + gstr("general.name") + struct.pack("<IQ", STRING, 1000) + b"tiny" * 4)
    add("string_elem_past_eof.gguf", "DATA_CORRUPT", "metadata[0] 'tokenizer.ggml.tokens'[2]: string length 4096",
        header(0, 1) + gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING, 3) + gstr("a") +
        gstr("b") + struct.pack("<Q", 4096) + b"c" * 16)
    add("huge_array_count.gguf", "DATA_CORRUPT", "metadata[0] 'tokenizer.ggml.scores': array count 1099511627776",
        header(0, 1) + gstr("tokenizer.ggml.scores") + struct.pack("<IIQ", ARRAY, F32, 2**40) + b"\0" * 64)
    # count * 8 wraps to 0 in 64 bits: must still be rejected.
    add("array_count_wraps.gguf", "DATA_CORRUPT", "array count 2305843009213693952",
        header(0, 1) + gstr("t.a") + struct.pack("<IIQ", ARRAY, U64, 2**61) + b"\0" * 64)
    add("huge_string_array.gguf", "DATA_CORRUPT", "array count 4611686018427387904 of string",
        header(0, 1) + gstr("t.s") + struct.pack("<IIQ", ARRAY, STRING, 2**62) + b"\0" * 64)
    add("bad_value_type.gguf", "DATA_CORRUPT", "metadata[1] 't.x': invalid value type 13",
        header(0, 2) + ARCH + gstr("t.x") + struct.pack("<IQ", 13, 0))
    add("bad_array_elem_type.gguf", "DATA_CORRUPT", "metadata[0] 't.x': invalid array element type 99",
        header(0, 1) + gstr("t.x") + struct.pack("<IIQ", ARRAY, 99, 1) + b"\0" * 8)
    bomb = struct.pack("<II", ARRAY, ARRAY) + b"".join(struct.pack("<QI", 1, ARRAY) for _ in range(40))
    add("nested_array_bomb.gguf", "DATA_CORRUPT", "arrays nested deeper than 8 levels",
        header(0, 1) + gstr("t.bomb") + bomb + struct.pack("<Q", 1) + b"\0" * 64)
    add("truncated_value.gguf", "DATA_CORRUPT", "metadata[1] 't.u64': file truncated",
        header(0, 2) + ARCH + gstr("t.u64") + struct.pack("<I", U64) + b"\1\2\3")
    add("duplicate_key.gguf", "DATA_CORRUPT", "metadata[2] 'general.architecture': duplicate key (first at metadata[0])",
        header(0, 3) + ARCH + kv("general.name", STRING, "x") + ARCH)
    add("alignment_zero.gguf", "DATA_CORRUPT", "'general.alignment': 0 is not a non-zero power of two",
        gguf([kv("general.alignment", U32, 0)], [], alignment=1))
    add("alignment_three.gguf", "DATA_CORRUPT", "'general.alignment': 3 is not a non-zero power of two",
        gguf([kv("general.alignment", U32, 3)], one_f32, alignment=3))
    add("alignment_wrong_type.gguf", "DATA_CORRUPT", "'general.alignment': must be a uint32, found uint64",
        gguf([kv("general.alignment", U64, 32)], one_f32))

    # --- tensor infos ---
    add("n_dims_5.gguf", "DATA_CORRUPT", "tensor_infos[0].n_dims ('w'): 5 dimensions",
        gguf([ARCH], [("w", [1, 1, 1, 1, 8], T_F32, 0)]))
    add("ne_negative.gguf", "DATA_CORRUPT", "tensor_infos[1].ne[1] ('v'): 18446744073709551615 is negative",
        gguf([ARCH], [("w", [8], T_F32, None), ("v", [8, 2**64 - 1], T_F32, 0)], data_len=64))
    add("ne_overflow.gguf", "DATA_CORRUPT", "tensor_infos[0].ne ('w'): the element count of shape [4294967296, "
        "4294967296, 1, 1] overflows int64", gguf([ARCH], [("w", [2**32, 2**32], T_F32, 0)], data_len=64))
    add("ne_product_2_63.gguf", "DATA_CORRUPT", "overflows int64",
        gguf([ARCH], [("w", [2**31, 2**32], T_F32, 0)], data_len=64))
    # An empty tensor whose other dims multiply past int64 (rows = ne[1]*ne[2] would overflow).
    add("ne_zero_dim_overflow.gguf", "DATA_CORRUPT", "shape [0, 1099511627776, 1099511627776, 1] overflows int64",
        gguf([ARCH], [("w", [0, 2**40, 2**40], T_F32, 0)], data_len=64))
    add("bytes_overflow.gguf", "DATA_CORRUPT", "tensor_infos[0].ne ('w'): the size in bytes overflows",
        gguf([ARCH], [("w", [2**62], T_F32, 0)], data_len=64))
    add("empty_tensor_name.gguf", "DATA_CORRUPT", "tensor_infos[0].name: empty tensor name",
        gguf([ARCH], [("", [8], T_F32, 0)]))
    add("duplicate_tensor_name.gguf", "DATA_CORRUPT",
        "tensor_infos[1].name ('w'): duplicate tensor name (first at tensor_infos[0])",
        gguf([ARCH], [("w", [8], T_F32, None), ("w", [8], T_F32, None)]))
    good = gguf([ARCH], [("w", [8], T_F32, None), ("v", [8, 2], T_F32, None)])
    cut = len(header(2, 1) + ARCH + tinfo("w", [8], T_F32, 0)) + 8 + 1 + 4 + 8 + 3  # inside v's ne[1]
    add("truncated_tensor_infos.gguf", "DATA_CORRUPT", "tensor_infos[1].ne[1] ('v'): file truncated", good[:cut])
    add("removed_type_4.gguf", "UNIMPLEMENTED",
        "tensor_infos[0].type ('w'): unsupported type id 4 (not a GGUF type known to this build)",
        gguf([ARCH], [("w", [256], 4, 0)], data_len=256))
    add("unknown_type_1000.gguf", "UNIMPLEMENTED", "unsupported type id 1000",
        gguf([ARCH], [("w", [256], 1000, 0)], data_len=256))
    add("unknown_type_negative.gguf", "UNIMPLEMENTED", "unsupported type id 4294967295",
        gguf([ARCH], [("w", [256], 2**32 - 1, 0)], data_len=256))
    add("ne0_not_block_multiple.gguf", "DATA_CORRUPT", "tensor_infos[0].ne[0] ('w'): 33 is not a multiple of the",
        gguf([ARCH], [("w", [33, 2], T_Q8_0, 0)], data_len=128))
    add("misaligned_offset.gguf", "DATA_CORRUPT", "tensor_infos[1].offset ('v'): 48 is not a multiple of the alignment 32",
        gguf([ARCH], [("w", [8], T_F32, 0), ("v", [8], T_F32, 48)], data_len=96))
    add("data_past_eof.gguf", "DATA_CORRUPT", "tensor_infos[0].offset ('w'): data (4096 bytes at file offset",
        gguf([ARCH], [("w", [1024], T_F32, 0)], data_len=2048))
    # An empty tensor still needs its start inside the file; here the data section (padding) is cut off.
    add("empty_tensor_past_eof.gguf", "DATA_CORRUPT", "tensor_infos[0].offset ('w'): data (0 bytes at file offset 128)",
        gguf([ARCH], [("w", [0, 4], T_F32, 0)])[:120])
    add("offset_wraps.gguf", "DATA_CORRUPT", "ends past the end of the file",
        gguf([ARCH], [("w", [8], T_F32, 2**64 - 32)], data_len=64))
    add("overlapping_tensors.gguf", "DATA_CORRUPT", "tensor_infos[1].offset ('v'): data (file bytes",
        gguf([ARCH], [("w", [32], T_F32, 0), ("v", [32], T_F32, 64)], data_len=192))
    add("overlap_contained.gguf", "DATA_CORRUPT", "overlaps tensor_infos[0] 'big'",
        gguf([ARCH], [("big", [64], T_F32, 0), ("small", [8], T_F32, 96), ("after", [8], T_F32, 256)],
             data_len=288))
    # Every GGUF type is read, runnable or not (IQ2_XXS: 256 elements in 66 bytes); a row that is not
    # whole blocks of its type is corrupt whatever the type.
    add("type_iq2_xxs.gguf", "OK", "", gguf([ARCH], [("w", [256, 2], 16, 0)], data_len=2 * 66))
    add("q4_K_ne0_not_block_multiple.gguf", "DATA_CORRUPT",
        "tensor_infos[0].ne[0] ('w'): 128 is not a multiple of the q4_K block size 256",
        gguf([ARCH], [("w", [128, 2], 12, 0)], data_len=288))
    return c


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out_dir, exist_ok=True)
    lines = []
    for name, status, substring, data in cases():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
        lines.append(f"{name} {status} {substring}".rstrip())
    with open(os.path.join(out_dir, "expected.txt"), "w") as f:
        f.write("# <file> <expected status> <substring of the error message> (written by tests/fuzz/make_corpus.py)\n")
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} files to {out_dir}")


if __name__ == "__main__":
    main()
