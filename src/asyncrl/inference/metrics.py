"""`/metrics` in Prometheus text format: throughput, queue lengths, KV cache use."""

from __future__ import annotations

from asyncrl.inference.serving_engine import ServingEngine


def render_metrics(engine: ServingEngine, model_name: str, weight_reloads: int = 0) -> str:
    running, waiting = engine.load()
    cached, hits = engine.prefix_cache_counts()
    label = f'{{model_name="{model_name}"}}'
    lines = [
        "# HELP asyncrl:generation_tokens_total Tokens generated since start.",
        "# TYPE asyncrl:generation_tokens_total counter",
        f"asyncrl:generation_tokens_total{label} {engine.stats.generated_tokens}",
        "# HELP asyncrl:prefill_tokens_total Prompt tokens run through prefill since start (a "
        "prompt shared by a request's n samples, or found in the prefix cache, counts once).",
        "# TYPE asyncrl:prefill_tokens_total counter",
        f"asyncrl:prefill_tokens_total{label} {engine.stats.prefill_tokens}",
        "# HELP asyncrl:engine_busy_seconds_total Seconds the engine spent stepping (prefill, "
        "decode, sampling), summed: busy time over wall time is its utilisation.",
        "# TYPE asyncrl:engine_busy_seconds_total counter",
        f"asyncrl:engine_busy_seconds_total{label} {engine.stats.busy_seconds:.6f}",
        "# HELP asyncrl:engine_borrowed_seconds_total Of those, seconds stepped with a core the "
        "trainer lent while it waited for a batch (`core_lending.py`).",
        "# TYPE asyncrl:engine_borrowed_seconds_total counter",
        f"asyncrl:engine_borrowed_seconds_total{label} {engine.stats.borrowed_seconds:.6f}",
        "# HELP asyncrl:engine_steps_total Engine steps (one batched forward pass each).",
        "# TYPE asyncrl:engine_steps_total counter",
        f"asyncrl:engine_steps_total{label} {engine.stats.steps}",
        "# HELP asyncrl:tokens_per_s Generated tokens per second over the last 10 s.",
        "# TYPE asyncrl:tokens_per_s gauge",
        f"asyncrl:tokens_per_s{label} {engine.stats.tokens_per_second():.3f}",
        "# HELP asyncrl:num_requests_running Sequences in the running batch.",
        "# TYPE asyncrl:num_requests_running gauge",
        f"asyncrl:num_requests_running{label} {running}",
        "# HELP asyncrl:num_requests_waiting Sequences waiting for a slot (or for resume).",
        "# TYPE asyncrl:num_requests_waiting gauge",
        f"asyncrl:num_requests_waiting{label} {waiting}",
        "# HELP asyncrl:kv_cache_usage_perc Fraction of KV cache slots running sequences hold.",
        "# TYPE asyncrl:kv_cache_usage_perc gauge",
        f"asyncrl:kv_cache_usage_perc{label} {engine.kv_cache_usage():.4f}",
        "# HELP asyncrl:prefix_cache_entries Slots holding a finished sequence's prefix.",
        "# TYPE asyncrl:prefix_cache_entries gauge",
        f"asyncrl:prefix_cache_entries{label} {cached}",
        "# HELP asyncrl:prefix_cache_hit_tokens_total Prompt tokens not prefilled: cached.",
        "# TYPE asyncrl:prefix_cache_hit_tokens_total counter",
        f"asyncrl:prefix_cache_hit_tokens_total{label} {hits}",
        "# HELP asyncrl:is_paused 1 while generation is paused.",
        "# TYPE asyncrl:is_paused gauge",
        f"asyncrl:is_paused{label} {int(engine.is_paused)}",
        "# HELP asyncrl:weight_reloads_total Weight loads read again because what arrived did "
        "not match the trainer's checksums (a delta that did not apply counts once).",
        "# TYPE asyncrl:weight_reloads_total counter",
        f"asyncrl:weight_reloads_total{label} {weight_reloads}",
    ]
    return "\n".join(lines) + "\n"
