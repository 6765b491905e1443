"""The harness id `asyncrl-chat` for verifiers (`harness: {id: asyncrl-chat}`).

verifiers resolves a harness id to a top-level module that exports its `Harness` subclass in
`__all__` (`verifiers/v1/utils/loaders.py`; a dotted id is not resolved), so asyncrl's chat
harness (`asyncrl/envs/verifiers/chat_harness.py`) is named here. Importing this module imports
verifiers: it needs the `verifiers` extra.
"""

from asyncrl.envs.verifiers.chat_harness import ChatHarness

__all__ = ["ChatHarness"]
