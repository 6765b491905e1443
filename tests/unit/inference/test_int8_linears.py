"""The engine's int8 linears (`inference.quantization: int8`, `int8_linears.py`): the product
within the quantization's bound of an independent float64 one, each row's result its own, and
the layer computing from its int8 copy only while gradients are off."""

from __future__ import annotations

import pytest
import torch

from asyncrl.inference.int8_linears import (
    Int8Weight,
    int8_linear,
    quantize_per_output_channel,
    use_int8_linears,
)


@pytest.mark.parametrize(
    ("rows", "inputs", "outputs"), [(1, 64, 48), (8, 576, 192), (40, 96, 100), (3, 37, 2100)]
)
def test_the_int8_product_is_within_the_quantization_bound_of_a_float64_one(
    rows: int, inputs: int, outputs: int
) -> None:
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(outputs, inputs, generator=generator) * 0.05
    weight[0, 3] = 0.9  # an outlier: its row's step is coarser, and the bound says so
    hidden = torch.randn(rows, inputs, generator=generator)
    hidden[0, 5] = 20.0  # an outlier input: the same for its row
    values, scales = quantize_per_output_channel(weight)

    product = int8_linear(hidden, Int8Weight(values, scales))

    reference = hidden.double() @ weight.double().t()
    row_values, row_scales = quantize_per_output_channel(hidden)  # the inputs, as rounded
    rounded = row_values.double() * row_scales.double()[:, None]
    # each input moved by at most half its row's step, each weight by half its row's: the sums
    # are exact integers, so the output moves by no more than these, plus float rounding
    bound = 0.5 * row_scales.double()[:, None] * weight.double().abs().sum(1)
    bound += 0.5 * rounded.abs().sum(1, keepdim=True) * scales.double()
    error = (product.double() - reference).abs()
    assert (error <= bound * (1 + 1e-5) + 1e-6 * reference.abs()).all()
    assert error.max() > 1e-4  # a quantized product, not the float one
    exact = (row_values.long() @ values.long().t()).double()  # the integer sums, exactly
    expected = exact * row_scales.double()[:, None] * scales.double()
    torch.testing.assert_close(product.double(), expected, rtol=1e-6, atol=1e-9)


def test_a_row_s_int8_product_does_not_depend_on_the_other_rows_of_its_pass() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = Int8Weight(*quantize_per_output_channel(torch.randn(3000, 64, generator=generator)))
    hidden = torch.randn(40, 64, generator=generator)
    hidden[7] *= 100  # a loud row must not change its neighbours' steps
    together = int8_linear(hidden, weight)
    for row in (0, 7, 39):
        assert torch.equal(int8_linear(hidden[row : row + 1], weight)[0], together[row])


def test_quantization_keeps_each_row_s_largest_weight_and_zero_rows() -> None:
    weight = torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [3.0, 1.0, -2.0]])
    values, scales = quantize_per_output_channel(weight)
    assert values.dtype == torch.int8 and values.is_contiguous()
    assert values.abs().amax(1).tolist() == [127, 0, 127]
    assert values[1].tolist() == [0, 0, 0] and scales[1] == 1.0
    torch.testing.assert_close(values[0, 1] * scales[0], torch.tensor(-1.0))


def test_an_int8_layer_computes_from_its_copy_without_gradients_and_from_floats_with_them() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 16))
    model.get_output_embeddings = lambda: None  # type: ignore[attr-defined,assignment]
    assert use_int8_linears(model, head=False) == 1
    layer, hidden = model[0], torch.randn(4, 32)
    weight = Int8Weight(*quantize_per_output_channel(layer.weight))
    with torch.no_grad():
        quantized = layer(hidden)
    assert torch.equal(quantized, int8_linear(hidden, weight) + layer.bias)
    assert torch.equal(layer(hidden), hidden @ layer.weight.t() + layer.bias)  # a trainer's path
