"""This CPU's instruction-set flags as ZipRL's choices see them: /proc/cpuinfo, capped by ``ONEDNN_MAX_CPU_ISA``.

oneDNN (torch's bf16 matrix products on a CPU) reads that variable to use no instructions above the ISA it names.
ZipRL's kernel and bf16 choices read it too, so one variable makes an AVX-512 machine run as an older CPU would:
``ONEDNN_MAX_CPU_ISA=AVX2`` measures what an AVX2-only laptop gets (set ``ATEN_CPU_CAPABILITY=avx2`` and
``MKL_ENABLE_INSTRUCTIONS=AVX2`` beside it to cap torch's own kernels and MKL the same way)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from ziprl.boundary import shown

# flag prefixes, from older to newer ("avx" alone: every AVX flag)
AVX, AVX2, AVX512, FP16, AMX = ("avx", "fma"), ("avx2", "avx_vnni", "fma"), ("avx512",), ("avx512_fp16",), ("amx",)
# oneDNN's ISA names (its docs, "CPU dispatcher control") -> the flag prefixes above that ISA, which the cap removes
ISA_DROPS: dict[str, tuple[str, ...]] = {
    "SSE41": AVX + AMX,
    "AVX": AVX2 + AVX512 + AMX,
    **dict.fromkeys(("AVX2", "AVX2_VNNI", "AVX2_VNNI_2"), AVX512 + AMX),
    **dict.fromkeys(("AVX512_CORE", "AVX512_CORE_VNNI"), ("avx512_bf16",) + FP16 + AMX),
    "AVX512_CORE_BF16": FP16 + AMX,
    **dict.fromkeys(("AVX512_CORE_FP16", "AVX10_1_512"), AMX),
    **dict.fromkeys(("AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "DEFAULT",
                     "ALL"), ()),
}


def parse_flags(cpuinfo: str) -> frozenset[str]:
    """The flags named on the ``flags`` lines of a /proc/cpuinfo text."""
    return frozenset(f for line in cpuinfo.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split())


def cap_flags(flags: frozenset[str], max_isa: str | None) -> frozenset[str]:
    """``flags`` without those above ``max_isa`` (a value of ``ONEDNN_MAX_CPU_ISA``; None or empty: no cap). A value
    oneDNN does not know caps nothing, as in oneDNN, with a warning naming the values it knows."""
    if not max_isa:
        return flags
    drops = ISA_DROPS.get(max_isa.strip().upper())
    if drops is None:
        warnings.warn(f"ONEDNN_MAX_CPU_ISA={shown(max_isa)} names no ISA oneDNN knows, so it caps nothing (oneDNN "
                      f"ignores it too); use one of {', '.join(ISA_DROPS)}", stacklevel=2)
        return flags
    return frozenset(f for f in flags if not f.startswith(drops))


def cpu_flags(max_isa: str | None = None) -> frozenset[str]:
    """This CPU's flags (Linux ``/proc/cpuinfo``; empty elsewhere), capped by ``max_isa`` (None: by
    ``ONEDNN_MAX_CPU_ISA`` when it is set; "": not at all)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    return cap_flags(parse_flags(text), os.environ.get("ONEDNN_MAX_CPU_ISA") if max_isa is None else max_isa)
