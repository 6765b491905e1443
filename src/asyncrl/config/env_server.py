"""`asyncrl env-server`: an environment served to orchestrators on other machines."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from asyncrl.config.base import StrictModel
from asyncrl.config.env import EnvConfig, rubric_only
from asyncrl.config.passthrough import checked_passthrough, passthrough_field


class EnvServerConfig(StrictModel):
    """Serves one environment's examples, rewards and turns over HTTP (`env[].address` on the
    orchestrator's side); its code runs in this server's worker processes."""

    env: EnvConfig = Field(description="The environment to serve (loaded here, in workers).")
    host: str = Field(
        "127.0.0.1",
        description="Bind address. Loopback unless set: use 0.0.0.0 to serve other machines.",
    )
    port: int = Field(8100, ge=1, le=65535, description="Bind port.")
    api_key_var: str = Field(
        "ASYNCRL_ENV_API_KEY",
        description="Environment variable holding the bearer API key the server requires. Unset "
        "or empty: no key, allowed on a loopback `host` only (the server refuses to start "
        "without one on any other address).",
    )
    workers: int = Field(2, ge=1, description="Worker processes running the environment's code.")
    timeout: float = Field(30.0, gt=0, description="Seconds per reward or per turn.")
    memory_limit: float | None = Field(
        None, gt=0, description="GiB of address space per worker (null = unlimited)."
    )
    cpu_limit: float | None = Field(
        None, gt=0, description="CPU seconds per task in a worker (null = unlimited)."
    )
    env_passthrough: list[str] = passthrough_field("the workers")
    max_request_bytes: int = Field(
        4 * 2**20, ge=1024, description="Largest request body accepted (413 beyond)."
    )
    max_queued: int = Field(
        16,
        ge=0,
        description="Requests (/score, /respond, /examples) admitted beyond those the workers "
        "are running; more get 503 at once, before their body is read (clients retry).",
    )
    max_connections: int = Field(
        64, ge=1, description="Open connections at most; more get 503 at once."
    )
    max_examples_per_request: int = Field(
        100_000,
        ge=1,
        description="Most examples one /examples request may ask for (422 beyond); the "
        "orchestrator asks for at most 100,000.",
    )
    examples_timeout: float = Field(
        120.0,
        gt=0,
        description="Seconds an /examples request may take (504 beyond). Examples are made off "
        "the event loop, one request at a time.",
    )

    @model_validator(mode="after")
    def _passthrough_holds_no_key(self) -> EnvServerConfig:
        checked_passthrough(self.env_passthrough, [self.api_key_var])
        return self

    @field_validator("env")
    @classmethod
    def _rubric_only(cls, env: EnvConfig) -> EnvConfig:
        return rubric_only(
            env, "put them on the orchestrator's `env` entry whose `address` is this server"
        )
