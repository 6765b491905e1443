"""Tiny models and tokenizers built locally, so that nothing needs a model hub."""
