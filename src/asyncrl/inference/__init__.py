"""The inference role: an OpenAI-compatible server in front of a generation engine."""
