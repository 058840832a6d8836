"""CPU speed work of :class:`ziprl.policy.engines.hf.engine.HFEngine`, in one place: one-token decode attention
(:mod:`~ziprl.policy.cpu.attention`), linear weights packed for oneDNN (:mod:`~ziprl.policy.cpu.linear`) and the
fused decode steps in C++ (:mod:`~ziprl.policy.cpu.fused_decode`, their sources in ``csrc/``, shipped as package
data), and the CPU's flags as they choose by them (:mod:`~ziprl.policy.cpu.isa`)."""
