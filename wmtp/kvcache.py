"""Position-indexed KV cache shared by the target LM and the MTP draft head.

The cache is a buffer ``(n_layers, B, Hkv, max_len, D)`` addressed by absolute token position,
as in gpt-fast. NOTE [No rollback]: a forward pass writes the keys of its input positions and
then reads, through the key-set formula, only keys at positions ``<= `` its queries' positions.
Speculative decoding writes draft or verify positions ``p .. p + depth``; positions past the
accepted prefix hold stale keys, but no later query reads a position before it has been written
again by the accepted tokens (queries only read ``j <= t`` and every step rewrites from the first
unaccepted position on). So rejected drafts need no rollback: they are simply overwritten.
(Paper arXiv 2607.21535, Sec. 3: the draft KV and the target KV are separate caches.)
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of ``n_layers`` attention layers, indexed by absolute position."""

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (n_layers, B, Hkv, S, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (n_layers, B, Hkv, S, D)

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def update(self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v`` ``(B, Hkv, L, D)`` at positions ``pos`` ``(L,)``; return the layer's buffers.

        Raises:
            ValueError: if a position does not fit in the cache.
        """
        if int(pos.max()) >= self.max_len:
            raise ValueError(f"position {int(pos.max())} does not fit in a KV cache of {self.max_len} positions")
        self.k[layer].index_copy_(2, pos, k.to(self.k.dtype))
        self.v[layer].index_copy_(2, pos, v.to(self.v.dtype))
        return self.k[layer], self.v[layer]  # (B, Hkv, S, D) each
