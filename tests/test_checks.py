"""The shared argument checks (wmtp/checks.py), case by case: each boundary on both sides, the
values a looser check would let through (a bool, a float integer, NaN, infinity, 2**64, -1)."""

import math

import numpy as np
import pytest
import torch

from wmtp.checks import SEED_LIMIT, as_real, check_int, check_number, check_seed, check_tensors


def test_check_int_takes_ints_from_low_up():
    for value in (3, 4, 10**20):
        check_int("n", value, 3)
    for value in (2, -1, True, 3.0, "3", None):
        with pytest.raises(ValueError, match=r"^n must be an integer >= 3, got "):
            check_int("n", value, 3)
    check_int("flag", 1, 1)  # 1 passes at low 1; True, which is also == 1, does not
    with pytest.raises(ValueError, match="got True"):
        check_int("flag", True, 1)


def test_check_number_bounds_and_finiteness():
    for value in (0.5, 1, 1e300):
        check_number("x", value, positive=True)
    for value in (0, 0.0, -1e-300, math.nan, math.inf, True, "1", None):
        with pytest.raises(ValueError, match=r"^x must be a finite number > 0, got "):
            check_number("x", value, positive=True)
    check_number("x", 0, positive=False)
    check_number("x", 0.0, positive=False)
    for value in (-1e-300, math.nan, math.inf, -math.inf, False):
        with pytest.raises(ValueError, match=r"^x must be a finite number >= 0, got "):
            check_number("x", value, positive=False)
    check_number("clip", math.inf, positive=True, finite=False)  # inf reads as "no limit"
    for value in (math.nan, 0, -math.inf):
        with pytest.raises(ValueError, match=r"^clip must be a number > 0, got "):
            check_number("clip", value, positive=True, finite=False)


def test_as_real_reads_numpy_reals_as_floats_and_leaves_the_rest():
    for value, out in ((np.float32(0.5), 0.5), (np.int64(3), 3.0)):
        assert as_real(value) == out and type(as_real(value)) is float
    # np.float64 is a float already; the rest for check_number to judge
    for value in (3, 2.5, np.float64(2.5), True, np.bool_(True), "1", None, torch.tensor(1.0)):
        assert as_real(value) is value
    for value in (1j, np.complex64(1)):  # numbers, not reals: float() is a TypeError or drops the imaginary part
        assert as_real(value) is value


def test_check_seed_is_an_int_in_0_to_2_64():
    assert SEED_LIMIT == 18446744073709551616
    for seed in (0, 1, SEED_LIMIT - 1):
        check_seed(seed)
    for seed in (-1, SEED_LIMIT, True, 0.0, "0", None):
        with pytest.raises(ValueError, match=r"^seed must be an int in \[0, 2\*\*64\), got "):
            check_seed(seed)
    with pytest.raises(ValueError, match="^noise_seed must"):
        check_seed(-1, "noise_seed")


def test_check_tensors_names_the_argument_that_is_not_a_tensor():
    check_tensors(a=torch.zeros(2), b=torch.tensor(1))
    for bad, kind in (([1, 2], "list"), (np.zeros(2), "ndarray"), (None, "NoneType")):
        with pytest.raises(ValueError, match=rf"^b must be a torch.Tensor, got {kind}$"):
            check_tensors(a=torch.zeros(2), b=bad)
