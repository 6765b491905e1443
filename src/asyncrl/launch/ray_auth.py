"""How the run's driver authenticates to Ray, and what to say when an actor dies unborn.

Ray (2.5x) turns its token authentication on by itself in two places. `ray.init()` starting a
new local instance enables it and, when no token exists yet, writes one to `~/.ray/auth_token`.
`ray.init(address="auto")` enables it whenever that file exists. A cluster started with
`ray start --head` before the file existed runs without authentication; a driver that joins it
after the file appeared refuses the cluster's untokened calls back into it, so the cluster takes
the driver for dead and destroys every actor it owns, before any of them runs: "The actor died
unexpectedly before finishing this task", with no log anywhere but Ray's. (CI saw exactly this:
one local-instance test wrote the file, and the next two tests on the shared cluster died.)

So a local instance for this run is authenticated with a secret of the run's own, passed in
the environment the raylet and every worker inherit, and nothing is written to `~/.ray`; the
user's own `RAY_AUTH_MODE` / `RAY_AUTH_TOKEN` win. When an actor dies before it ever answered,
the message says what Ray said, where Ray's logs are, and, when this driver found a token that
the cluster does not check, that and the two ways out.
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AUTH_MODE = "RAY_AUTH_MODE"
AUTH_TOKEN = "RAY_AUTH_TOKEN"
REFUSED_CALL = "Missing authorization header"  # the driver's core-worker log, per refused call


def authenticate_local_instance() -> bool:
    """Before `ray.init` starts a local instance: token authentication with a fresh secret,
    unless the user chose a mode or a token. True when this run's secret was set.

    Ray reads the mode into its C++ configuration when it is imported; an imported Ray is told
    to read it again, as Ray does itself when it switches the mode on."""
    if AUTH_MODE in os.environ or AUTH_TOKEN in os.environ:
        return False
    os.environ[AUTH_MODE] = "token"
    os.environ[AUTH_TOKEN] = secrets.token_hex(32)
    raylet = sys.modules.get("ray._raylet")
    if raylet is not None:
        raylet.Config.initialize("")
    return True


@dataclass(frozen=True)
class JoinedAuth:
    """How the driver joined: whether Ray switched token authentication on by itself (a token
    file found while joining an existing cluster with `address: auto`)."""

    switched_on_by_ray: bool

    @classmethod
    def around(cls, chosen_mode: str | None) -> JoinedAuth:
        """`chosen_mode`: RAY_AUTH_MODE before `ray.init`; compared with what Ray left."""
        return cls(chosen_mode is None and os.environ.get(AUTH_MODE, "").lower() == "token")


def driver_log(ray: Any) -> Path | None:
    """This driver's core-worker log, where Ray records the calls it refused."""
    try:
        logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    except (AttributeError, TypeError):
        return None
    found = sorted(logs.glob(f"python-core-driver-*_{os.getpid()}.log"))
    return found[-1] if found else None


def explain_unborn_actor(error: BaseException, auth: JoinedAuth, ray: Any) -> str:
    """Why an actor may have died before it ran: Ray's own words, its log directory, and an
    authentication mismatch when this driver's log shows refused calls."""
    said = "\n".join(f"  {line.strip()}" for line in str(error).strip().splitlines()[:8])
    log = driver_log(ray)
    parts = [f"Ray says:\n{said}"]
    refused = False
    if log is not None:
        try:
            refused = REFUSED_CALL in log.read_text(errors="replace")
        except OSError:
            refused = False
        parts.append(f"Ray's logs for this driver: {log.parent}")
    if refused or auth.switched_on_by_ray:
        parts.append(
            "this driver uses Ray's token authentication"
            + (" (Ray switched it on because ~/.ray/auth_token exists)" if auth.switched_on_by_ray
               else "")
            + ", and the cluster "
            + ("refused to call back into it" if refused else "may not use it")
            + ": a cluster started without a token cannot reach a driver that requires one, and "
            "destroys its actors before they run. Join with the cluster's own setting "
            f"({AUTH_MODE}=disabled for a cluster without authentication), or start the cluster "
            f"with {AUTH_MODE}=token and the same token."
        )  # fmt: skip
    return "\n".join(parts)
