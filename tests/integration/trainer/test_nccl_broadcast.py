"""Weight broadcast over torch.distributed (gloo on this CPU; the same code runs NCCL on GPUs):
the trainer sends each step's weights straight into the live embedded server."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from asyncrl.launch.inference_process import free_port, inference_server
from asyncrl.transport.batches import write_batch
from asyncrl.transport.broadcast import STABLE

from .rollouts import sample_batch
from .test_trainer import PROMPTS, run_train

pytestmark = pytest.mark.integration


def test_trainer_broadcasts_each_step_into_the_server(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    outputs = tmp_path / "outputs"
    run_dir = outputs / "run_default"
    group = ["--weight_broadcast_port", str(port), "--weight_broadcast_timeout", "60"]
    with inference_server(
        tiny_model_dir, "--max_model_len", "256", "--weight_broadcast_type", "nccl", *group
    ) as url:
        before = httpx.get(f"{url}/weight_info").json()
        for step in (1, 2):
            write_batch(run_dir, sample_batch(url, str(tiny_model_dir), PROMPTS, step=step))
        result = run_train(
            tiny_model_dir, outputs, "--max_steps", "2", "--lora", "false",
            "--weight_broadcast.type", "nccl", "--weight_broadcast.port", str(port),
            "--weight_broadcast.timeout", "60",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        deadline = time.monotonic() + 30
        while (info := httpx.get(f"{url}/weight_info").json())["version"] != 2:
            assert time.monotonic() < deadline, info
            time.sleep(0.1)
        assert httpx.get(f"{url}/health").status_code == 200

    marker = json.loads((run_dir / "broadcasts" / "step_2" / STABLE).read_text())
    assert marker["kind"] == "nccl"
    assert not (run_dir / "broadcasts" / "step_2" / "model.safetensors").exists()
    assert info["fingerprint"] == marker["fingerprint"] != before["fingerprint"]


def test_a_sender_without_receivers_raises_within_its_timeout() -> None:
    script = (
        "from asyncrl.transport.nccl_broadcast import WeightSender\n"
        f"WeightSender('127.0.0.1', {free_port()}, receivers=1, timeout=3)\n"
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert time.monotonic() - started < 60
    assert "timed out" in result.stderr.lower() or "timeout" in result.stderr.lower()


def outward_address() -> str | None:
    """This machine's address on its default route (a UDP connect sends nothing), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_the_rendezvous_store_listens_on_the_configured_host_only() -> None:
    """The store has no authentication; torch's own server listened on every interface."""
    outside = outward_address()
    if outside is None:
        pytest.skip("this machine has no address but loopback to try from")
    port = free_port()
    script = (
        "from asyncrl.transport.nccl_broadcast import WeightSender\n"
        f"WeightSender('127.0.0.1', {port}, receivers=1, timeout=20)\n"
    )
    sender = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:  # the sender is up once loopback accepts
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and sender.poll() is None
                time.sleep(0.2)
        with pytest.raises(OSError):
            socket.create_connection((outside, port), timeout=2).close()
    finally:
        sender.kill()
        sender.wait()


TEARING_SENDER = """
import sys, time, torch
from transformers import AutoModelForCausalLM
from asyncrl.transport.nccl_broadcast import WeightSender

model = AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.float32)
with torch.no_grad():
    for parameter in model.parameters():
        parameter.add_(0.01)

class TearingSender(WeightSender):
    torn = False

    def _broadcast(self, name, tensor):
        if not self.torn and name == sys.argv[3]:  # the first transfer arrives damaged
            self.torn = True
            tensor = tensor.clone()
            tensor.view(-1)[0] += 1.0
        super()._broadcast(name, tensor)

sender = TearingSender("127.0.0.1", int(sys.argv[1]), 1, 60)
print("fingerprint", sender.send(1, model).fingerprint, flush=True)
deadline = time.monotonic() + 300
while time.monotonic() < deadline:  # as a trainer waiting for its next batch
    sender.admit_restarted_servers()
    time.sleep(0.2)
"""


def test_a_torn_transfer_is_never_served_and_is_sent_again(tiny_model_dir: Path) -> None:
    """A tensor damaged on the way (here by the sender, after its manifest was made): the server
    finds it does not check, asks the trainer to send again, and serves only the good copy.
    It used to install what arrived."""
    port = free_port()
    tensor = "model.layers.0.self_attn.v_proj.weight"
    group = ["--weight_broadcast_port", str(port), "--weight_broadcast_timeout", "60"]
    with inference_server(
        tiny_model_dir, "--max_model_len", "256", "--weight_broadcast_type", "nccl", *group
    ) as url:
        sender = subprocess.Popen(
            [sys.executable, "-c", TEARING_SENDER, str(port), str(tiny_model_dir), tensor],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert sender.stdout is not None
            fingerprint = sender.stdout.readline().split()[-1]
            deadline = time.monotonic() + 240
            while (info := httpx.get(f"{url}/weight_info").json())["version"] != 1:
                assert time.monotonic() < deadline and sender.poll() is None, info
                time.sleep(0.2)
            assert info["verified"] == info["fingerprint"] == fingerprint
            assert info["weight_reloads"] == 1
            assert httpx.get(f"{url}/health").status_code == 200
        finally:
            sender.kill()
            sender.wait()


DELTA_SENDER = """
import sys, time, torch
from transformers import AutoModelForCausalLM
from asyncrl.transport.fingerprint import version_checksum
from asyncrl.transport.nccl_broadcast import WeightSender
from asyncrl.transport.weights.delta import DeltaPolicy

model = AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.float32)
policy = DeltaPolicy("auto", torch.float32, torch.bfloat16)
sender = WeightSender("127.0.0.1", int(sys.argv[1]), 1, 60, torch.bfloat16, policy)
generator = torch.Generator().manual_seed(0)
for step in (1, 2, 3):
    with torch.no_grad():  # an RL step's size: few bfloat16 roundings move
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 1e-5)
    manifest = sender.send(step, model)
    served = version_checksum(manifest.checksums_at(torch.bfloat16))
    kind = "delta" if sender.outgoing.delta else "full"
    print("sent", step, kind, manifest.fingerprint, served, flush=True)
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    sender.admit_restarted_servers()
    time.sleep(0.2)
"""


def test_bfloat16_versions_after_the_first_go_as_deltas_into_the_server(
    tiny_model_dir: Path,
) -> None:
    """Float32 master weights served in bfloat16 over gloo: version 1 goes whole, 2 and 3 as
    what changed, and the server serves exactly the trainer's bfloat16 values."""
    port = free_port()
    group = ["--weight_broadcast_port", str(port), "--weight_broadcast_timeout", "60"]
    with inference_server(
        tiny_model_dir, "--max_model_len", "256", "--dtype", "bfloat16",
        "--weight_broadcast_type", "nccl", *group,
    ) as url:  # fmt: skip
        sender = subprocess.Popen(
            [sys.executable, "-c", DELTA_SENDER, str(port), str(tiny_model_dir)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert sender.stdout is not None
            sent = [sender.stdout.readline().split() for _ in range(3)]
            assert [line[2] for line in sent] == ["full", "delta", "delta"]
            deadline = time.monotonic() + 120
            while (info := httpx.get(f"{url}/weight_info").json())["version"] != 3:
                assert time.monotonic() < deadline and sender.poll() is None, info
                time.sleep(0.2)
            assert (info["verified"], info["checksum"]) == (sent[2][3], sent[2][4])
            assert (info["loaded"], info["dtype"], info["weight_reloads"]) == (
                "delta", "bfloat16", 0,
            )  # fmt: skip
        finally:
            sender.kill()
            sender.wait()
