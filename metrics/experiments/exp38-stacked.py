"""Experiment 38: decoding in the CUDA-graph loop with each block's q/k/v products as one product of
the stacked weights and its gate/up products as another (wmtp/stacked.py) against one product per
weight, side by side in one run on the H200.

Variants: ``separate`` (``wmtp.linear.stacks`` patched to say no: the products of the code before;
``wmtp.model.stacks`` when the committed JSON ran, before the products moved to wmtp/linear.py) and
``stacked`` (as committed). The stacked products agree with the separate ones to rounding, not bit
for bit, so each variant's speculative tokens are compared with its own dense tokens. The loop, the
models and the figures are metrics/experiments/side_by_side.py's.

Usage: python3 metrics/experiments/exp38-stacked.py BUNDLE_DIR OUT.json [CONTEXT ...]
"""

import sys

from side_by_side import run

from wmtp import linear as products
from wmtp import stacked


def separate() -> None:
    products.stacks = lambda impl, x, weights: False


def stacked_products() -> None:
    products.stacks = stacked.stacks


run(38, {"separate": separate, "stacked": stacked_products}, sys.argv)
