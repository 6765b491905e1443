"""What crosses process boundaries: rollout batches and weights."""
