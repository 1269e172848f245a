"""``python -m tessera``: the version, the GPUs found and the kernel families prebuilt."""

from __future__ import annotations

import sys
from typing import List, Optional

from . import _C, build_info


def main(argv: Optional[List[str]] = None) -> int:
    """Prints the build report to stdout; returns the exit status (always 0)."""
    info = build_info()
    out = sys.stdout
    out.write(f"tessera {info['version']}\n")
    out.write(f"CUDA runtime {info['cuda_runtime']}, driver {info['cuda_driver']}\n")
    archs = ", ".join(f"sm_{a}" for a in info["cuda_archs"]) or "(unknown)"
    out.write(f"kernels compiled for: {archs}\n")
    if not info["gpus"]:
        out.write(f"GPU: none ({_C.cuda_unavailable_reason() or 'no CUDA GPU'})\n")
    for g in info["gpus"]:
        major, minor = g["compute_capability"]
        usable = "yes" if g["kernels_compiled_for_it"] else "NO (rebuild with TESSERA_CUDA_ARCHS including it)"
        out.write(
            f"GPU {g['index']}: {g['name']} (sm_{major}{minor}, {g['sm_count']} SMs, "
            f"{g['memory_bytes'] / 2**30:.1f} GiB), prebuilt kernels run on it: {usable}\n"
        )
    out.write("prebuilt kernel families:\n")
    for k in info["kernels"]:
        dims = k["head_dims"]
        dims_text = "head_dim " + ", ".join(str(d) for d in dims) if isinstance(dims, list) else dims
        out.write(f"  {k['family']:<20} {dims_text}; {', '.join(k['dtypes'])}\n")
        out.write(f"  {'':<20} {k['description']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
