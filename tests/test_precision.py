"""`exact_fp32()` (vae/precision.py): TF32 off inside, the switches restored exactly on exit, nested and on
an exception. The switches are process-wide and settable without a GPU."""

from __future__ import annotations

import pytest
import torch

from turbovae.vae import precision
from turbovae.vae.precision import current_settings, exact_fp32, tf32_possible


@pytest.fixture
def restore_switches():
    saved = current_settings()
    yield
    precision.apply_settings(saved)


def test_exact_fp32_turns_tf32_off_and_restores_the_switches(restore_switches):
    before = current_settings()
    assert tf32_possible()  # torch's default: cuDNN fp32 convs may use TF32
    with exact_fp32():
        assert not tf32_possible()
        inside = current_settings()
        assert inside != before
    assert current_settings() == before and tf32_possible()


def test_nesting_restores_level_by_level(restore_switches):
    before = current_settings()
    with exact_fp32():
        outer = current_settings()
        with exact_fp32():
            assert not tf32_possible()
        assert current_settings() == outer and not tf32_possible()
    assert current_settings() == before


def test_restored_after_an_exception(restore_switches):
    before = current_settings()
    with pytest.raises(ZeroDivisionError):
        with exact_fp32():
            1 / 0
    assert current_settings() == before


def test_a_user_setting_is_kept_not_reset_to_torchs_default(restore_switches):
    with exact_fp32():  # the user (or an outer comparison) already chose IEEE fp32
        chosen = current_settings()
        with exact_fp32():
            pass
        assert current_settings() == chosen and not tf32_possible()
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = False, True
    mine = current_settings()
    assert tf32_possible()
    with exact_fp32():
        assert not tf32_possible()
    assert current_settings() == mine


def test_results_on_cpu_are_unchanged(seeded):
    x, w = torch.randn(1, 4, 8, 8, generator=seeded), torch.randn(4, 4, 3, 3, generator=seeded)
    plain = torch.nn.functional.conv2d(x, w, padding=1)
    with exact_fp32():
        assert torch.equal(torch.nn.functional.conv2d(x, w, padding=1), plain)


def test_new_style_switches_are_saved_and_restored_through_their_own_api(restore_switches):
    b = torch.backends
    if not hasattr(getattr(b.cudnn, "conv", None), "fp32_precision"):
        pytest.skip("this torch has no fp32_precision switches")
    b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision, b.cuda.matmul.fp32_precision = "ieee", "tf32", "tf32"
    before = current_settings()
    assert before.legacy is None and before.new == ("ieee", "tf32", "tf32") and tf32_possible()
    with exact_fp32():
        assert not tf32_possible()
    assert current_settings() == before
    b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision, b.cuda.matmul.fp32_precision = "tf32", "tf32", "none"
