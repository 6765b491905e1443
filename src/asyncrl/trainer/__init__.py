"""The trainer role: model, packing, logprobs, loss, optimisation, weight broadcast."""
