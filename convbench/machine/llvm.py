"""LLVM target machines for code compiled here with llvmlite (Numba's own LLVM): the FMA peak's
loop (`measure.ceilings.fma`) and `direct`'s register-blocked kernels (`algos.blocked_llvm`)."""

from __future__ import annotations


def target_machine(cpu: str = "", opt: int = 3):
    """A target machine for `cpu` ("": the host's name and features, as Numba compiles), at
    optimisation level `opt`. One per execution engine: an engine owns its target machine, and
    one freed with a shared machine freed it under the others."""
    import llvmlite.binding as llvm

    try:
        llvm.initialize()  # llvmlite before 0.45 needs it; later ones raise: they do it alone
    except RuntimeError:
        pass
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    if cpu:
        return target.create_target_machine(cpu=cpu, opt=opt)
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(), opt=opt)
