"""Environments: prompts with answers, and the reward of a completion."""

from asyncrl.envs.base import Environment, Example, RewardFunction, score
from asyncrl.envs.registry import load_environment

__all__ = ["Environment", "Example", "RewardFunction", "load_environment", "score"]
