"""How a process that runs a user's code for the run starts: reward workers (rubric functions,
multi-turn turns, the tools they call and every program those start), scorer plugins and
reward models, and the short-lived process that checks a function named by import path.

Its environment is an allowlist, one rule for all of them: what a program needs to run and to
import its packages (`ALLOWED`, `ALLOWED_PREFIXES`: the search path, home, locale, temporary
directory, `PYTHON*`, thread counts, cache locations and offline switches, certificates), plus
the variables the config passes through by name (`reward_env_passthrough`; `pass_through`).
Nothing else of the role's environment reaches it: no credential of the user's (`HF_TOKEN`,
`WANDB_API_KEY`, `AWS_*`, `OPENAI_API_KEY`, `SSH_AUTH_SOCK`) unless named, and never a key of
the run (`run_secret.withheld`), even if named.

Before it execs it also drops the capabilities that would read another process
(`process_privacy.drop_reading_capabilities`) and asks to die with its parent.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

from asyncrl.lifetime import die_with_parent
from asyncrl.process_privacy import drop_reading_capabilities
from asyncrl.run_secret import withheld

# what a program needs to run, find its packages and use the machine's threads, devices, caches
# and certificates: places and switches, never credentials
ALLOWED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "TERM", "TZ", "LANG", "LANGUAGE",
    "TMPDIR", "TEMP", "TMP",
    "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "LD_PRELOAD",
    "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "NUMEXPR_MAX_THREADS",
    "VECLIB_MAXIMUM_THREADS", "RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM",
    "CUDA_VISIBLE_DEVICES",
    "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE", "TORCH_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "ASYNCRL_LOG_LEVEL",
})  # fmt: skip
ALLOWED_PREFIXES = ("LC_", "PYTHON", "OMP_", "MKL_", "KMP_")

_passed: set[str] = set()


def pass_through(*variables: str) -> None:
    """Let these variables (a config's `reward_env_passthrough`) reach user code too, from now
    on in this process; a key of the run never does."""
    _passed.update(variables)


def allowed(name: str) -> bool:
    """Whether user code is given the variable `name` (not a key of the run, and allowlisted
    or passed through)."""
    if name in withheld():
        return False
    return name in ALLOWED or name.startswith(ALLOWED_PREFIXES) or name in _passed


def user_code_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process that runs a user's code: what `allowed` lets through of
    this process's environment (or `environ`)."""
    source = os.environ if environ is None else environ
    return {name: value for name, value in source.items() if allowed(name)}


def start_user_code() -> None:
    """In the child, before it execs user code (a `preexec_fn`): SIGKILL when the process that
    started it dies (it cannot clean up then; SIGKILL reaches one stuck in user code, or
    stopped, too), and none of the capabilities that would read another process."""
    die_with_parent(signal.SIGKILL)
    drop_reading_capabilities()
