"""Supervised warm-up: the checkpoint RL starts from."""
