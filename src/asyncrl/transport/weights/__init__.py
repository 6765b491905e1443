"""How weights version s travel from the trainer to the inference servers: one interface
(`route.py`), one module per way of doing it, each holding both of its ends.

- `files.py`: a broadcast directory under the run (`broadcasts/step_s/`, full weights or a LoRA
  adapter); the orchestrator tells the servers to load it over HTTP, so the servers need no
  receiver of their own.
- `nccl.py`: torch.distributed (NCCL on GPUs, gloo on CPU), the trainer as rank 0 and every
  server one more rank; a receiving thread in each server installs what arrives.
- `colocated.py`: an engine in the trainer's process takes the trainer's tensors in memory
  between steps (its host, which builds the engine, is `asyncrl.colocation.engine_host`).

Adding one (a delta or sparse sync, CUDA IPC, NIXL, …) is one new module: a `WeightRoute`
subclass for the trainer's side, a `WeightIntake` for the server's side (or none when the
orchestrator loads files), and a `TRANSPORT = WeightTransport(...)` naming both. Name it in the
config as `weight_broadcast.type: package.module:TRANSPORT` (`asyncrl rl`; the trainer's own
`weight_broadcast.type` alone); the servers get the same name. docs/training.md ("Writing a
weight transport") walks through it.
"""
