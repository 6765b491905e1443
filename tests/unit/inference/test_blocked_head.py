"""The engine's LM head in column blocks: the same logits as the head's own product, and the
head's own forward wherever blocks could change something (gradients, a bias, another dtype)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from asyncrl.inference.blocked_head import blocked_linear, use_blocked_head


def test_blocked_product_matches_the_whole_product_at_every_block_edge() -> None:
    torch.manual_seed(0)
    weight = torch.randn(1000, 48, dtype=torch.float64)  # 1000 columns: a ragged last block
    hidden = torch.randn(3, 5, 48, dtype=torch.float64)
    for columns in (1, 7, 256, 999, 1000, 4096):
        blocked = blocked_linear(hidden, weight, columns)
        assert blocked.shape == (3, 5, 1000)
        torch.testing.assert_close(blocked, hidden @ weight.T, rtol=1e-12, atol=1e-12)


def _tiny_model(tied: bool) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=3000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(1)
    return LlamaForCausalLM(config).eval()


def test_the_models_logits_are_its_own_and_its_parameters_unchanged() -> None:
    for tied in (True, False):
        model = _tiny_model(tied)
        ids = torch.randint(0, 3000, (4, 6))
        with torch.inference_mode():
            before = model(input_ids=ids).logits
        names = [name for name, _ in model.named_parameters()]
        assert use_blocked_head(model, columns=512)
        with torch.inference_mode():
            after = model(input_ids=ids).logits
        torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
        assert [name for name, _ in model.named_parameters()] == names
        if tied:  # doubling a tied head would double the embedding too
            continue
        # new weights written into the head are used on the next pass
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(2.0)
        with torch.inference_mode():
            doubled = model(input_ids=ids).logits
        torch.testing.assert_close(doubled, 2.0 * before, rtol=1e-5, atol=1e-4)


def test_with_gradients_on_the_head_runs_its_own_forward_and_trains() -> None:
    model = _tiny_model(tied=False)
    use_blocked_head(model, columns=512)
    ids = torch.randint(0, 3000, (2, 5))
    model(input_ids=ids).logits.sum().backward()
    assert model.get_output_embeddings().weight.grad is not None


def test_a_head_with_a_bias_is_left_alone() -> None:
    model = _tiny_model(tied=False)
    head = torch.nn.Linear(32, 3000, bias=True)
    model.set_output_embeddings(head)
    assert not use_blocked_head(model)
    assert "forward" not in vars(head)
