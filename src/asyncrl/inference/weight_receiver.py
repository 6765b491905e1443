"""The inference side of NCCL/gloo weight broadcast: a thread that receives each step's weights
from the trainer and installs them between engine steps. It joins the trainer's group by itself
and joins again whenever the trainer restarts or re-forms the group."""

from __future__ import annotations

import threading

from asyncrl.config.inference import InferenceConfig
from asyncrl.inference.served_model import ServedModel
from asyncrl.log import get_logger
from asyncrl.transport.nccl_broadcast import WeightReceiver

logger = get_logger(__name__)


class WeightReceiverThread(threading.Thread):
    def __init__(self, served: ServedModel, config: InferenceConfig) -> None:
        super().__init__(name="asyncrl-weight-receiver", daemon=True)
        self.served = served
        self.config = config
        self._stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        config = self.config
        receiver = WeightReceiver(
            config.weight_broadcast_host,
            config.weight_broadcast_port,
            config.weight_broadcast_rank,
            config.weight_broadcast_world_size,
            config.weight_broadcast_timeout,
        )
        try:
            while not self._stop_event.is_set():
                received = receiver.receive(self.served.engine.model, self._stop_event.is_set)
                if received is None:
                    break
                self.served.apply_received(*received)
        except Exception as error:  # reported on /health; the server keeps serving old weights
            self.error = error
            logger.exception("weight receiver stopped: %s", error)
        finally:
            receiver.close()

    def stop(self) -> None:
        self._stop_event.set()
