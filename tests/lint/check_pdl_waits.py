#!/usr/bin/env python3
"""Every CUDA kernel of lib/cuda may be launched with programmatic dependent launch (lib/cuda/launch.cuh):
it then starts before the kernel ahead of it in the stream has finished, and only its first statement,
pdl_grid_sync(), makes it wait. A kernel that reads, writes or returns before that wait races with its
predecessor (and breaks the ordering of the kernels after it) only for the length of a memory flush,
which tests rarely catch. So this check reads the sources:
  - every __global__ function's body starts with `pdl_grid_sync();` (or `pdl_grid_sync_small();`, the
    same wait followed by the small grids' early trigger), or, in the GEMVs that load model weights
    before their wait (launch.cuh), with `if constexpr (!EARLY) pdl_grid_sync();` followed later by
    `if constexpr (EARLY) pdl_grid_sync();` (what comes before that second wait is checked in the
    machine code: scripts/check_pdl_sass.py on the GPU machine);
  - no kernel is launched with <<<...>>> (launches go through launch_kernel(), which sets the attribute).
Usage: check_pdl_waits.py LIB_CUDA_DIR [FILE...]; exit 1 with one line per offence.
"""
import pathlib
import re
import sys

# Comments and string literals out, so that a kernel named in a comment is not taken for one.
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\])*\"", re.S)


# The early-weights form (GEMVs that load model weights before their wait).
_EARLY_FIRST = "if constexpr (!EARLY) pdl_grid_sync();"
_EARLY_LATER = "if constexpr (EARLY) pdl_grid_sync();"


def strip_comments(text: str) -> str:
    return _COMMENTS.sub(lambda m: "" if m.group(0).startswith("/") else '""', text)


def matching(code: str, open_at: int, opening: str = "(", closing: str = ")") -> int:
    """Index of the bracket closing the one at open_at (the last index if it never closes)."""
    depth = 0
    for i in range(open_at, len(code)):
        depth += code[i] == opening
        depth -= code[i] == closing
        if depth == 0:
            return i
    return len(code) - 1


def offences(path: pathlib.Path) -> list[str]:
    code = strip_comments(path.read_text())
    found = []
    for m in re.finditer(r"<<<", code):
        line = code.count("\n", 0, m.start()) + 1
        found.append(f"{path}:{line}: kernel launched with <<<...>>>; use launch_kernel() (lib/cuda/launch.cuh)")
    for m in re.finditer(r"__global__", code):
        # The kernel's name is the first identifier followed by '(' other than __launch_bounds__ (whose
        # parentheses are skipped); the body starts at the first '{' after the parameter list (a
        # declaration ends with ';' first).
        pos, name = m.end(), "?"
        while True:
            ident = re.compile(r"(\w+)\s*\(").search(code, pos)
            if ident is None:
                return found + [f"{path}: unparsable __global__"]
            paren = ident.end() - 1
            i = matching(code, paren)
            if ident.group(1) != "__launch_bounds__":
                name = ident.group(1)
                break
            pos = i + 1
        rest = code[i + 1:]
        brace, semi = rest.find("{"), rest.find(";")
        if brace < 0 or (0 <= semi < brace):
            continue  # a declaration
        end = matching(rest, brace, "{", "}")
        body = rest[brace + 1:end].lstrip()  # this kernel's body only
        line = code.count("\n", 0, m.start()) + 1
        if body.startswith(_EARLY_FIRST):
            if _EARLY_LATER not in body[len(_EARLY_FIRST):]:
                found.append(f"{path}:{line}: kernel {name} starts with the early-weights form but has no "
                             f"`{_EARLY_LATER}`")
        elif not (body.startswith("pdl_grid_sync();") or body.startswith("pdl_grid_sync_small();")):
            found.append(f"{path}:{line}: kernel {name} does not start with pdl_grid_sync();")
    return found


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    files = [pathlib.Path(p) for p in argv[2:]] or sorted(
        p for p in pathlib.Path(argv[1]).iterdir() if p.suffix in (".cu", ".cuh"))
    kernels = sum(strip_comments(f.read_text()).count("__global__") for f in files)
    found = [o for f in files for o in offences(f)]
    for o in found:
        print(o)
    if kernels == 0:
        print(f"check_pdl_waits: no kernels found under {argv[1]}")
        return 1
    print(f"check_pdl_waits: {kernels} kernels in {len(files)} files, {len(found)} offences")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
