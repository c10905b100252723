"""wmtp: Windowed-MTP speculative decoding (arXiv 2607.21535), reproduced and explained.

The draft head attends to ``n_sink`` attention sinks plus the ``window`` most recent keys; the
target verifies with its own attention, untouched by ``(n_sink, window)``, so the output is exactly
the target's greedy output.
"""

import torch

from .attention import attention, paged_attention, resolve_impl
from .batched import BatchedStats, batched_speculative_generate
from .checks import check_seed
from .config import PRESETS, KeySetConfig, ModelConfig, MTPConfig, SpecConfig, TrainConfig, get_preset
from .decode import greedy_generate, speculative_generate, verify_greedy, verify_greedy_loop
from .keyset import draft_key_csr, draft_key_indices, draft_key_mask
from .kvcache import ring_slot
from .lockstep import LockstepStats, batched_greedy_generate, lockstep_generate
from .model import TargetLM
from .mtp import MTPHead
from .policy import AdaptiveDepth, FixedDepth
from .prefill import Prefill, prefill_prompt
from .sampling import sample_generate, speculative_sample, verify_rejection
from .static_batched import static_batched_speculative_generate
from .static_decode import static_greedy_generate, static_speculative_generate
from .static_lockstep import static_batched_greedy_generate, static_lockstep_generate
from .stats import SpecStats

__version__ = "0.1.0"


def build_models(preset: str = "tiny", seed: int = 0) -> tuple[TargetLM, MTPHead]:
    """Randomly initialised target and MTP head of a named preset, in eval mode.

    Args:
        preset: a name in ``wmtp.PRESETS``.
        seed: seeds one ``torch.Generator`` used for both models' weights (an int in ``[0, 2**64)``).

    Returns:
        ``(target, head)``: a ``TargetLM`` and the ``MTPHead`` built on it, float32 on the CPU.

    Raises:
        ValueError: for an unknown preset or a seed that is not an int in ``[0, 2**64)``.
    """
    p = get_preset(preset)
    check_seed(seed)
    g = torch.Generator().manual_seed(seed)
    target = TargetLM(p.model, generator=g)
    head = MTPHead(p.mtp, target, generator=g)
    return target.eval(), head.eval()


__all__ = [
    "attention", "paged_attention", "ring_slot", "resolve_impl", "draft_key_indices", "draft_key_mask",
    "draft_key_csr", "TargetLM", "MTPHead", "build_models", "greedy_generate", "speculative_generate", "SpecStats",
    "static_greedy_generate", "static_speculative_generate", "Prefill", "prefill_prompt",
    "batched_greedy_generate", "lockstep_generate", "LockstepStats", "static_batched_greedy_generate",
    "static_lockstep_generate", "batched_speculative_generate", "BatchedStats", "static_batched_speculative_generate",
    "sample_generate", "speculative_sample", "verify_rejection", "FixedDepth", "AdaptiveDepth",
    "verify_greedy", "verify_greedy_loop", "PRESETS", "get_preset", "ModelConfig", "MTPConfig",
    "KeySetConfig", "SpecConfig", "TrainConfig", "__version__",
]
