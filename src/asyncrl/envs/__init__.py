"""Environments: prompts with answers, and the reward of a completion."""

from asyncrl.envs.base import Environment, Example
from asyncrl.envs.registry import load_environment

__all__ = ["Environment", "Example", "load_environment"]
