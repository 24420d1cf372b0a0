"""AMX in engine actors: permitted for the process, or not used by vLLM's CPU kernels.

On x86 hosts with AMX (Sapphire Rapids and later: `amx_tile`, `amx_bf16` in /proc/cpuinfo) a
process may execute AMX tile instructions only after asking Linux for the permission with
`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`; without it the first tile instruction
raises SIGILL. Linux refuses the request (ENOSPC) while any thread of the process has an
alternate signal stack too small for the larger signal frame AMX state needs
(arch/x86/kernel/fpu/xstate.c, `validate_sigaltstack`), and Ray's worker processes install such
stacks before any user code runs. vLLM's CPU build chooses its kernels from CPUID alone:
`torch.cpu._is_amx_tile_supported()` decides the attention ISA ("amx" for bf16,
`vllm/v1/attention/backends/cpu_attn.py`, `_get_attn_isa`) and the small-GEMM kernel that
repacks weights (`vllm/model_executor/layers/utils.py`, `check_cpu_sgl_kernel`). So an engine
built in a Ray actor on such a host may pick AMX kernels it is not allowed to run.

`settle_amx()` is called by every engine actor before its engine is built:

    no AMX on this CPU                       "absent"     nothing to do
    AMX, and Linux grants the permission     "permitted"  vLLM uses AMX (torch.cpu._init_amx)
    AMX, permission refused                  "refused"    torch.cpu._is_amx_tile_supported
                                                           answers False in this process, so
                                                           vLLM picks its AVX-512 kernels

oneDNN asks for the permission itself and falls back when refused, so only vLLM's own choices
need the answer. Evidence: read (the vLLM 0.32 and torch sources named above, Linux's xstate
rules); the rule is unit-tested here with the probes injected (tests/test_gpu_rules.py);
the machines this was written on have AVX-512 but no AMX, so the SIGILL and its fix were not
reproduced. Not covered: vLLM's tensor-parallel worker processes on CPU (spawned outside Ray,
they inherit nothing of this).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

log = logging.getLogger(__name__)

Isa = Literal["absent", "permitted", "refused"]


def settle_amx(cpu: Any = None) -> Isa:
    """Ask for AMX where the CPU has it; where Linux refuses, make torch (and so vLLM) see
    none in this process. `cpu` is `torch.cpu` (injectable for tests)."""
    if cpu is None:
        import torch

        cpu = torch.cpu
    if not cpu._is_amx_tile_supported():
        return "absent"
    if cpu._init_amx():  # arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) granted
        return "permitted"
    cpu._is_amx_tile_supported = _no_amx  # vLLM asks torch.cpu at each kernel choice
    log.warning(
        "this CPU has AMX but Linux refused the permission to use it in this process "
        "(a small signal stack in one of its threads); vLLM's CPU kernels run without AMX"
    )
    return "refused"


def _no_amx() -> bool:
    return False
