#!/usr/bin/env python3
"""Checks the PDL order of the CUDA kernels in the machine code: what each kernel loads before its
griddepcontrol.wait (SASS ACQBULK), from `cuobjdump -sass` of the library (the GPU machine has cuobjdump):

    cuobjdump -sass build/lib/libmoeinfer.so.0 > sass.txt && scripts/check_pdl_sass.py sass.txt

Before its wait a kernel may only read model weights (lib/cuda/launch.cuh), and only the dense GEMVs
with early weight loads do (gemv_kernel / gemv_rows_kernel with EARLY = true): through the read-only
path (LDG...CONSTANT), or byte by byte (LD.E.U8: load16_guarded at a weight tensor's edge; activations
are never loaded by the byte). Any other load there may read bytes the previous kernel is still writing: ptxas
moves ld.global.nc loads above the wait (it takes their data as fixed for the kernel's lifetime), which
is why activations after an early start are loaded with ld.global.ca. Exit status 1 on a finding.
Loads are counted up to the last ACQBULK of a kernel, in code order (branches may differ at run time).
"""
import re
import sys


def kernels(text):
    heads = list(re.finditer(r"Function : (\S+)", text))
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        yield m.group(1), text[m.end():end]


def is_early(name):
    # gemv_kernel<W, MC, FUSED, EARLY, RPW> and gemv_rows_kernel<W, MC, RK, EARLY> (mangled) with EARLY = true.
    return (re.search(r"gemv_kernelIL.*ELb[01]ELb1ELi\d+EEEv", name) is not None or
            re.search(r"gemv_rows_kernelIL.*ELb1EEEv", name) is not None)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    text = open(sys.argv[1], errors="replace").read()
    bad, early, checked = [], 0, 0
    for name, body in kernels(text):
        wait = body.rfind("ACQBULK")
        if wait < 0:
            continue
        checked += 1
        loads = re.findall(r"\b(LDG[.\w]*|LD\.[.\w]*)\b", body[:wait])
        if not loads:
            continue
        if is_early(name) and all("CONSTANT" in l or l.endswith(".U8") for l in loads):
            early += 1
            continue
        bad.append(f"{name}: {len(loads)} loads before the wait: {sorted(set(loads))}")
    print(f"{checked} kernels wait; {early} load weights before their wait (early GEMVs); {len(bad)} load other data")
    for b in bad:
        print("  BAD", b)
    if checked == 0:
        sys.exit("no kernel with an ACQBULK found: is this cuobjdump -sass output of an sm_90 build?")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
