#!/usr/bin/env python3
"""Checks the PDL order of the CUDA kernels in the machine code: what each kernel does before its
griddepcontrol.wait (SASS ACQBULK), from `cuobjdump -sass` of the library (the GPU machine has cuobjdump):

    cuobjdump -sass build/lib/libmoeinfer.so.0 > sass.txt && scripts/check_pdl_sass.py sass.txt

Before its wait a kernel may only read model weights (lib/cuda/launch.cuh), and only the dense GEMVs
with early weight loads do (gemv_kernel / gemv_float_kernel / gemv_rows_kernel with EARLY = true):
  - gemv_kernel: at most one chunk's 16-byte vectors per lane (kVpl of its weight type) through the
    read-only path (LDG.E.128.CONSTANT), plus byte loads (load16_guarded at a weight tensor's edge);
  - gemv_float_kernel: at most kU steps of its 4 rows, a read-only load of 8 (F16 / BF16) or 16 (F32)
    bytes each, which bypasses L1 (whatever cache qualifier ptxas prints besides CONSTANT);
  - gemv_rows_kernel: at most kRowSteps = 4 weight loads of 16 (F32) or 8 (F16 / BF16) bytes.
More loads than that mean something else moved above the wait: ptxas moves ld.global.nc (__ldg) loads
there (it takes their data as fixed for the kernel's lifetime), which is why activations after an early
start are loaded with ld.global.ca. Any other kernel loading before its wait, and any store or atomic
before a kernel's first wait, is an offence too. Exit status 1 on an offence.
Loads are counted in code order up to the kernel's last ACQBULK (branches may differ at run time).
"""
import re
import sys

# Bytes per 32-value block by the weight type's id in mangled names (moe::Type, ggml's numbering).
BLOCK_BYTES = {0: 128, 1: 64, 30: 64, 8: 34, 2: 18, 39: 17}
ROW_STEPS = 4  # gemv_rows_kernel's kRowSteps


def kernels(text):
    heads = list(re.finditer(r"Function : (\S+)", text))
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        yield m.group(1), text[m.end():end]


def exactly(mnemonic):
    return lambda l: l == mnemonic


def read_only(bits):
    """A read-only global load of `bits` bits with any further qualifiers (L1 no-allocate, eviction hints)."""
    return lambda l: l.startswith("LDG.E.") and ".CONSTANT" in l and f".{bits}" in l


def early_allowance(name):
    """(weight load predicate, how many) an early GEMV may issue before its wait; None for other kernels."""
    m = re.search(r"gemv_kernelILN\w*?TypeE(\d+)ELi\d+ELb[01]ELb1ELi\d+EEEv", name)
    if m:  # gemv_kernel<W, MC, FUSED, EARLY = true, RPW>
        chunk = 32 * BLOCK_BYTES[int(m.group(1))]
        vecs = (chunk + 30) // 16
        return exactly("LDG.E.128.CONSTANT"), (vecs + 31) // 32
    m = re.search(r"gemv_float_kernelILN\w*?TypeE(\d+)ELi(\d+)ELb1EEEv", name)
    if m:  # gemv_float_kernel<W, MC, EARLY = true>: kU = (MC <= 2 ? 4 : 2) / (bytes per weight / 2) steps of 4 rows
        f32 = int(m.group(1)) == 0
        steps = (4 if int(m.group(2)) <= 2 else 2) // (2 if f32 else 1)
        return read_only(128 if f32 else 64), 4 * steps
    m = re.search(r"gemv_rows_kernelILN\w*?TypeE(\d+)E.*ELb1EEEv", name)
    if m:  # gemv_rows_kernel<W, MC, RK, EARLY = true>
        return exactly("LDG.E.128.CONSTANT" if int(m.group(1)) == 0 else "LDG.E.64.CONSTANT"), ROW_STEPS
    return None


def check(name, body):
    """(offence or None, whether the kernel loads anything before its wait)."""
    first, last = body.find("ACQBULK"), body.rfind("ACQBULK")
    writes = re.findall(r"\b(STG[.\w]*|ST\.E[.\w]*|ATOMG?[.\w]*|REDG?[.\w]*)\b", body[:first])
    loads = re.findall(r"\b(LDG[.\w]*|LD\.[.\w]*)\b", body[:last])
    if writes:
        return f"{len(writes)} stores or atomics before the first wait: {sorted(set(writes))}", bool(loads)
    allowed = early_allowance(name)
    if allowed is None:
        return (f"{len(loads)} loads before the wait: {sorted(set(loads))}" if loads else None), bool(loads)
    is_weight_load, most = allowed
    others = [l for l in loads if not is_weight_load(l) and not l.endswith(".U8")]
    vectors = sum(1 for l in loads if is_weight_load(l))
    if others or vectors > most:
        return (f"{vectors} weight loads (at most {most}) and {len(others)} other loads before the wait: "
                f"{sorted(set(loads))}"), True
    return None, bool(loads)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    text = open(sys.argv[1], errors="replace").read()
    bad, early, checked = [], 0, 0
    for name, body in kernels(text):
        if "ACQBULK" not in body:
            continue
        checked += 1
        found, loads_early = check(name, body)
        if found:
            bad.append(f"{name}: {found}")
        elif loads_early:  # only early GEMVs get here with loads
            early += 1
    print(f"{checked} kernels wait; {early} load weights before their wait (early GEMVs); {len(bad)} offences")
    for b in bad:
        print("  BAD", b)
    if checked == 0:
        sys.exit("no kernel with an ACQBULK found: is this cuobjdump -sass output of an sm_90 build?")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
