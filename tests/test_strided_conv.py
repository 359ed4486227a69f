"""strided_conv's ops (the GEMM feature encoder's strided convolutions, accumulating in place):
equal to ``conv1d`` over the same frames, values and both gradients (float64 gradcheck), for
kernels longer than, equal to and shorter than the stride; one op each way under
torch.compile (no graph break), and torch.library's own checks of the op's registration."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

from trainables.model.strided_conv import strided_conv


def _as_conv1d(hidden: torch.Tensor, weight: torch.Tensor, stride: int) -> torch.Tensor:
    """conv1d over each item's rows (batch, rows, in) -> (batch, frames, out)."""
    return F.conv1d(hidden.transpose(1, 2), weight, stride=stride).transpose(1, 2)


@pytest.mark.parametrize(("kernel", "stride"), [(3, 2), (2, 2), (5, 2), (1, 2), (4, 4), (10, 5)])
def test_the_op_equals_conv1d_and_its_gradients(kernel, stride):
    torch.manual_seed(0)
    rows = 8 * stride * (-(-kernel // stride) + 2)  # items long enough for kept frames
    hidden = torch.randn(3, rows, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 6, kernel, dtype=torch.float64, requires_grad=True)
    out = strided_conv(hidden, weight, stride)
    want = _as_conv1d(hidden, weight, stride)
    assert out.shape == (3, rows // stride, 5)
    kept = want.shape[1]  # the frames conv1d makes; the rows past them read the next item
    torch.testing.assert_close(out[:, :kept], want)
    grad = torch.randn_like(out)
    grad[:, kept:] = 0  # as the encoder: the rows past the kept frames take no gradient
    got = torch.autograd.grad(out, (hidden, weight), grad)
    ref = torch.autograd.grad(want, (hidden, weight), grad[:, :kept])
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(lambda h, w: strided_conv(h, w, stride), (hidden, weight))


def test_compiled_it_stays_one_op_each_way_and_passes_torch_librarys_checks():
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    fn = torch.compile(lambda h, w: strided_conv(h, w, 2), backend=counter, fullgraph=True)
    hidden = torch.randn(2, 16, 8, requires_grad=True)
    weight = torch.randn(4, 8, 3, requires_grad=True)
    fn(hidden, weight).sum().backward()
    assert counter.frame_count == 1
    eager = torch.autograd.grad(strided_conv(hidden, weight, 2).sum(), weight)[0]
    torch.testing.assert_close(weight.grad, eager)
    opcheck(torch.ops.stage1.strided_conv.default, (hidden, weight, 2))


def test_a_frozen_weight_or_input_takes_no_gradient_and_the_other_is_unchanged():
    torch.manual_seed(0)
    hidden = torch.randn(2, 24, 6, dtype=torch.float64)
    weight = torch.randn(5, 6, 3, dtype=torch.float64)
    grad = torch.randn(2, 12, 5, dtype=torch.float64)
    both = torch.autograd.grad(
        strided_conv(hidden.requires_grad_(), weight.requires_grad_(), 2), (hidden, weight), grad
    )
    (only_input,) = torch.autograd.grad(
        strided_conv(hidden, weight.detach(), 2), (hidden,), grad
    )  # fmt: skip
    (only_weight,) = torch.autograd.grad(
        strided_conv(hidden.detach(), weight, 2), (weight,), grad
    )  # fmt: skip
    torch.testing.assert_close(only_input, both[0])
    torch.testing.assert_close(only_weight, both[1])
