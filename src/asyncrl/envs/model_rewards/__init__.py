"""Reward terms that are models: a reward model, a generative judge, a user's scorer plugin."""
