"""The orchestrator role: rollouts, rewards, advantages, filters, batches for the trainer."""
