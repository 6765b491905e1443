"""Checkpoints of a run: `run_*/checkpoints/step_N/<role>/`, each with a COMPLETE marker."""
