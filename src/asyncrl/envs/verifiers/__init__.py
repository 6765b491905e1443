"""verifiers environments (`verifiers.v1`, 0.4.0) trained as they are (docs/environments.md).

The environment's own code (its taskset, harness, tools, rewards and judges) runs in worker
processes (`worker.py`) that import verifiers; the orchestrator's side (`environment.py`,
`pool.py`, `record.py`, `detect.py`) never does. The policy's turns reach the run's inference
servers through the orchestrator's token gate (`orchestrator/token_gate.py`), which records the
exact ids and logprobs that are then trained.

Nothing here is imported by `asyncrl.envs` itself: the `verifiers` extra is optional.
"""
