"""This CPU's flags as ZipRL's choices see them (ziprl/policy/cpu/isa.py): /proc/cpuinfo capped by
``ONEDNN_MAX_CPU_ISA``, so an AVX-512 machine measures what an AVX2-only one gets with one variable."""

from __future__ import annotations

import pytest

from ziprl.learner.hardware import bf16_pays, cpu_has_bf16
from ziprl.policy.cpu import fused_decode, isa
from ziprl.policy.cpu.isa import ISA_DROPS, cap_flags, cpu_flags, parse_flags

EPYC = frozenset({"fma", "avx", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"})
SAPPHIRE = EPYC | {"avx512_fp16", "amx_bf16", "amx_tile", "amx_int8"}


def test_flags_are_read_from_every_flags_line_and_nothing_else():
    text = "processor\t: 0\nflags\t\t: fpu avx2 fma\nmodel name\t: flags avx512f\nflags\t\t: avx2 avx512_bf16\n"
    assert parse_flags(text) == {"fpu", "avx2", "fma", "avx512_bf16"}
    assert parse_flags("") == frozenset()


@pytest.mark.parametrize(("max_isa", "kept"), [
    (None, SAPPHIRE), ("", SAPPHIRE), ("DEFAULT", SAPPHIRE), ("AVX512_CORE_AMX", SAPPHIRE),
    ("AVX512_CORE_BF16", EPYC), ("avx512_core_fp16", EPYC | {"avx512_fp16"}),
    ("AVX512_CORE", EPYC - {"avx512_bf16"}), ("AVX512_CORE_VNNI", EPYC - {"avx512_bf16"}),
    ("AVX2", {"fma", "avx", "avx2"}), (" avx2 ", {"fma", "avx", "avx2"}), ("AVX2_VNNI_2", {"fma", "avx", "avx2"}),
    ("AVX", {"avx"}), ("SSE41", set()),
])
def test_the_cap_removes_exactly_the_flags_above_the_isa_it_names(max_isa, kept):
    """oneDNN's order: SSE41 < AVX < AVX2 < AVX512_CORE(_VNNI) < AVX512_CORE_BF16 < AVX512_CORE_FP16 <
    AVX512_CORE_AMX; a cap keeps every flag at or below the ISA it names (case and spaces aside)."""
    assert cap_flags(SAPPHIRE, max_isa) == kept


def test_every_isa_name_caps_and_an_unknown_one_caps_nothing_as_in_onednn_with_a_warning():
    for name in ISA_DROPS:
        assert cap_flags(SAPPHIRE, name) <= SAPPHIRE
    with pytest.warns(UserWarning, match=r"ONEDNN_MAX_CPU_ISA='AVX3' names no ISA oneDNN knows, so it caps nothing.*AVX2"):
        assert cap_flags(SAPPHIRE, "AVX3") == SAPPHIRE
    with pytest.warns(UserWarning, match=r"\(100000 chars\)"):  # any text: shortened in the message
        assert cap_flags(SAPPHIRE, "\u00e9" * 100_000) == SAPPHIRE


def test_this_cpu_under_the_avx2_cap_gets_the_avx2_kernel_and_no_bf16(monkeypatch):
    """The real dispatch, not a patched one: with the variable set, the fused decode step is the float32 AVX2 one
    and bf16 is neither native nor measured (an AVX2 bf16 product runs at ~0.3 GFLOP/s: the measurement alone
    took ~6 minutes)."""
    monkeypatch.setattr(isa.Path, "read_text", lambda self, errors=None: "flags\t: " + " ".join(sorted(SAPPHIRE)))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert cpu_flags() == SAPPHIRE
    assert cpu_has_bf16()
    assert fused_decode.cpu_kernel() is fused_decode.BF16
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cpu_flags() == {"fma", "avx", "avx2"}
    assert not cpu_has_bf16()
    assert fused_decode.cpu_kernel() is fused_decode.F32_AVX2
    assert cpu_flags("") == SAPPHIRE  # an explicit "" caps nothing, whatever the environment says
    assert cpu_flags("AVX512_CORE_BF16") == EPYC
    monkeypatch.setattr("ziprl.learner.hardware.gemm_rates", lambda *a, **k: pytest.fail("bf16 was measured"))
    assert bf16_pays("cpu") is False


def test_a_cpu_without_proc_cpuinfo_has_no_flags(monkeypatch):
    def unreadable(self, errors=None):
        raise FileNotFoundError(self)

    monkeypatch.setattr(isa.Path, "read_text", unreadable)
    assert cpu_flags() == frozenset()
    assert fused_decode.cpu_kernel() is None
