"""A CPU backend for vLLM's weight-transfer API: weights broadcast over a gloo process group.

vLLM's RL weight sync is a four-call handshake (``init_weight_transfer_engine``, ``start_weight_update``,
``update_weights``, ``finish_weight_update``) between a trainer-side engine and a worker-side engine of the
same backend, registered in ``WeightTransferTrainerFactory`` and ``WeightTransferEngineFactory``. Its
built-in backends need GPUs (NCCL, CUDA IPC). This module adds ``gloo_cpu``:

- rendezvous: the trainer opens a ``TCPStore`` and both sides join one gloo group (trainer rank 0,
  the inference worker rank 1), so trainer and server may be separate processes or hosts;
- transfer: the trainer packs its parameters into one flat buffer per dtype (metadata order) and
  broadcasts it while the worker's ``update_weights`` receives it; the names, dtypes and shapes travel
  in the update info (JSON, so the same calls go over vLLM's HTTP routes);
- loading: vLLM's layerwise reload (``initialize_layerwise_reload`` at start, ``model.load_weights``
  with checkpoint-format tensors, ``finalize_layerwise_reload`` at finish), which rebuilds the fused
  and CPU-repacked layers the way loading a checkpoint does.

A second backend, ``local_cpu``, serves an engine in the trainer's own process (``llm.sampling.vllm_engine``): the
trainer leaves its tensors in a process-local hand-off table and the worker's ``update_weights`` loads them from
there by key, through the same layerwise reload: no flat buffer, no broadcast, none of the two copies of the
weights that ``gloo_cpu`` makes (for SmolLM2-135M-Instruct, 0.6 GB each; seconds per sync: docs/benchmarks.md).
vLLM reads the trainer's tensors without changing them (``tests/contracts/test_families.py`` checks the policy bit
for bit after a sync).

``register()`` adds both backends to both factories; it is also the project's ``vllm.general_plugins``
entry point, so every vLLM process (an API server's engine core included) knows them.
Only single-worker engines (tensor parallel 1) are supported here.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
    WeightSource,
)

BACKEND = "gloo_cpu"
#: The backend of an engine in the trainer's process.
LOCAL_BACKEND = "local_cpu"
#: Seconds either side waits for the other at the rendezvous and during a broadcast.
TIMEOUT_S = 300


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """Worker side: where the trainer's TCPStore listens."""

    master_address: str
    master_port: int
    world_size: int = 2


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One round: every parameter's name, dtype and shape, in the order of the flat buffers."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self):
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError("names, dtype_names and shapes must have one entry per parameter")


def _buckets(dtype_names: list[str]) -> dict[str, list[int]]:
    """Parameter indices per dtype, dtypes in order of first appearance: one flat buffer each."""
    out: dict[str, list[int]] = {}
    for i, d in enumerate(dtype_names):
        out.setdefault(d, []).append(i)
    return out


def _group(store, rank: int, world_size: int):
    return torch.distributed.ProcessGroupGloo(store, rank, world_size, datetime.timedelta(seconds=TIMEOUT_S))


class CheckpointFormatEngine(WeightTransferEngine):
    """Worker side, shared by both backends: tensors in checkpoint format, loaded through vLLM's layerwise reload
    (started and finished around each round), on a single-worker engine."""

    backend: ClassVar[str] = ""

    def __init__(self, config, vllm_config, device, model):
        super().__init__(config, vllm_config, device, model)
        if vllm_config.parallel_config.world_size != 1:
            raise ValueError(f"{self.backend}: only single-worker engines (tensor/pipeline parallel 1) are supported")

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which has nothing to do on CPU.
        self.receive_weights(self.parse_update_info(update_info))

    def load(self, weights) -> None:
        """``(name, tensor)`` pairs in checkpoint format into the model (inside a layerwise reload)."""
        self.model.load_weights(weights=[(n, t) for n, t in weights if self._wants(n)])

    def _wants(self, name: str) -> bool:
        """Every tensor but a tied output layer the vLLM model does not have (Gemma computes the logits with the
        embedding and has no ``lm_head``; Qwen2 keeps one, refreshed only when it arrives)."""
        return not (name.startswith("lm_head.") and not hasattr(self.model, "lm_head"))


class GlooWeightTransferEngine(CheckpointFormatEngine, WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """Worker side: joins the trainer's gloo group, receives the flat buffers, loads them layerwise."""

    backend = BACKEND
    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, config, vllm_config, device, model):
        super().__init__(config, vllm_config, device, model)
        self.group = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        store = torch.distributed.TCPStore(init_info.master_address, init_info.master_port, init_info.world_size,
                                           is_master=False, timeout=datetime.timedelta(seconds=TIMEOUT_S))
        self.group = _group(store, 1, init_info.world_size)

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError(f"{BACKEND}: init_weight_transfer_engine was not called")
        for dtype_name, idx in _buckets(update_info.dtype_names).items():
            shapes = [torch.Size(update_info.shapes[i]) for i in idx]
            flat = torch.empty(sum(s.numel() for s in shapes), dtype=getattr(torch, dtype_name))
            self.group.broadcast(flat, 0).wait()
            tensors = [t.view(s) for t, s in zip(flat.split([s.numel() for s in shapes]), shapes)]
            self.load((update_info.names[i], t) for i, t in zip(idx, tensors))

    def shutdown(self) -> None:
        self.group = None


#: The in-process backend's hand-off table: key -> the trainer's (name, tensor) pairs of one round, held only while
#: the worker loads them.
_HANDOFF: dict[str, list[tuple[str, torch.Tensor]]] = {}


@dataclass
class LocalInitInfo(WeightTransferInitInfo):
    """Worker side: the trainer's token, which its hand-off table holds only in the trainer's own process."""

    token: str


@dataclass
class LocalUpdateInfo(WeightTransferUpdateInfo):
    """One round: the key of its tensors in the hand-off table."""

    key: str


class LocalWeightTransferEngine(CheckpointFormatEngine, WeightTransferEngine[LocalInitInfo, LocalUpdateInfo]):
    """Worker side of an engine in the trainer's process: loads the trainer's tensors from the hand-off table."""

    backend = LOCAL_BACKEND
    init_info_cls = LocalInitInfo
    update_info_cls = LocalUpdateInfo

    def init_transfer_engine(self, init_info: LocalInitInfo) -> None:
        if init_info.token not in _HANDOFF:
            raise RuntimeError(f"{LOCAL_BACKEND}: the trainer is not in this process (an engine in another process "
                               f"needs {BACKEND})")

    def receive_weights(self, update_info: LocalUpdateInfo) -> None:
        if update_info.key not in _HANDOFF:
            raise RuntimeError(f"{LOCAL_BACKEND}: no weights under {update_info.key!r} in this process")
        self.load(_HANDOFF[update_info.key])

    def shutdown(self) -> None:
        pass


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer side: the address the worker reaches the trainer's TCPStore at (port 0: any free port)."""

    backend: ClassVar[str] = BACKEND
    master_address: str = "127.0.0.1"
    master_port: int = 0


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer side: opens the rendezvous and drives each round (start, update + broadcast, finish)."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client, source, group, is_sender=True):
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.group = group
        self.version = 0

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client, source=None):
        if source is None:
            raise ValueError(f"{BACKEND}: needs a WeightSource (CheckpointSource(model))")
        store = torch.distributed.TCPStore(init_info.master_address, init_info.master_port, 2, is_master=True,
                                           wait_for_workers=False, timeout=datetime.timedelta(seconds=TIMEOUT_S))
        worker_info = {"master_address": init_info.master_address, "master_port": store.port, "world_size": 2}
        with cf.ThreadPoolExecutor(1) as pool:  # the worker joins while we do
            joined = pool.submit(client.init_weight_transfer_engine, worker_info)
            group = _group(store, 0, 2)
            joined.result()
        engine = cls(client=client, source=source, group=group)
        engine._store = store  # keep the rendezvous alive as long as the group
        return engine

    def send_weights(self, weight_version: str | None = None) -> None:
        """One full round: every parameter of the source goes to the worker, which loads it layerwise."""
        meta = self.source.metadata()
        info = {"names": [m.name for m in meta], "dtype_names": [str(m.dtype).removeprefix("torch.") for m in meta],
                "shapes": [list(m.shape) for m in meta]}
        tensors = [t.detach() for _, t in self.source]
        self.client.start_weight_update()
        pool = cf.ThreadPoolExecutor(1)  # the worker receives while we broadcast
        try:
            received = pool.submit(self.client.update_weights, info)
            for idx in _buckets(info["dtype_names"]).values():
                if received.done():  # the request failed before the worker joined: do not wait in broadcast
                    received.result()
                flat = torch.cat([tensors[i].reshape(-1).cpu() for i in idx])
                self.group.broadcast(flat, 0).wait()
            received.result()
        finally:
            # If the broadcast raised, the request thread may never return: do not join it.
            pool.shutdown(wait=False)
        self.version += 1
        self.client.finish_weight_update(weight_version if weight_version is not None else str(self.version))

    def shutdown(self) -> None:
        self.group = None


@dataclass
class LocalTrainerInitInfo(TrainerInitInfo):
    """Trainer side of ``local_cpu``: nothing to configure (the engine must be in this process)."""

    backend: ClassVar[str] = LOCAL_BACKEND


class LocalTrainerWeightTransferEngine(TrainerWeightTransferEngine[LocalTrainerInitInfo]):
    """Trainer side of ``local_cpu``: each round leaves the source's tensors (the trainer's own, not copied) in the
    hand-off table for the length of the worker's ``update_weights`` call."""

    init_info_cls = LocalTrainerInitInfo

    def __init__(self, *, client, source, token: str, is_sender=True):
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.token = token
        self.version = 0

    @classmethod
    def trainer_init(cls, init_info: LocalTrainerInitInfo, *, client, source=None):
        if source is None:
            raise ValueError(f"{LOCAL_BACKEND}: needs a WeightSource (CheckpointSource(model))")
        token = uuid.uuid4().hex
        _HANDOFF[token] = []  # marks this process as the trainer's for the worker's check
        try:
            client.init_weight_transfer_engine({"token": token})
        finally:
            del _HANDOFF[token]
        return cls(client=client, source=source, token=token)

    def send_weights(self, weight_version: str | None = None) -> None:
        """One full round: the worker loads every tensor of the source, layerwise."""
        key = f"{self.token}/{self.version}"
        _HANDOFF[key] = [(name, t.detach()) for name, t in self.source]
        try:
            self.client.start_weight_update()
            self.client.update_weights({"key": key})
        finally:
            del _HANDOFF[key]
        self.version += 1
        self.client.finish_weight_update(weight_version if weight_version is not None else str(self.version))


#: The trainer-side init info of each backend, for an engine in this process (its defaults: a loopback rendezvous).
TRAINER_INIT_INFO = {BACKEND: GlooTrainerInitInfo, LOCAL_BACKEND: LocalTrainerInitInfo}


class CheckpointSource(WeightSource):
    """The trainer's weights as a checkpoint holds them: ``state_dict()``, tied weights included.

    vLLM's own ``ModuleSource`` iterates ``named_parameters()``, which lists a tied output layer once (as the
    embedding). On CPU, vLLM keeps a separately repacked copy of a tied ``lm_head``, and the layerwise reload
    only refreshes it when ``lm_head.weight`` arrives: measured on the tiny model (tied embeddings), syncing
    from ``ModuleSource`` left the sampler 0.34 nats off the trainer, from this source 1e-6.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(k, v.dtype, tuple(v.shape)) for k, v in self._weights().items()]

    def __iter__(self):
        return ((k, v.detach()) for k, v in self._weights().items())

    def _weights(self) -> dict[str, torch.Tensor]:
        """Under the plain model's names; a LoRA policy's merged (``llm.models.model.plain_state_dict``)."""
        from llm.models.model import plain_state_dict

        return plain_state_dict(self.model)

    def nbytes(self) -> int:
        """Bytes one round sends (every tensor of the state dict)."""
        return sum(t.numel() * t.element_size() for _, t in self)


class HTTPClient:
    """vLLM's HTTP weight-sync client (``HTTPVLLMWeightSyncClient``) whose failures become one exception:
    ``on_error(route, exc)`` returns what to raise (the server sampler's one-line ``ServerError``)."""

    def __init__(self, base_url: str, timeout: float, on_error):
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient

        self.inner = HTTPVLLMWeightSyncClient(base_url, timeout=timeout)
        self.on_error = on_error

    def _call(self, route: str, *args):
        try:
            return getattr(self.inner, route)(*args)
        except Exception as exc:  # requests' errors, HTTP errors: all end the sync the same way
            raise self.on_error(f"/{route}", exc) from None

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self._call("init_weight_transfer_engine", init_info)

    def start_weight_update(self) -> None:
        self._call("start_weight_update")

    def update_weights(self, update_info) -> None:
        self._call("update_weights", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._call("finish_weight_update", weight_version)

    def shutdown_weight_transfer_engine(self) -> None:
        self._call("shutdown_weight_transfer_engine")


def trainer_init_info(address: str, server_world_size: int) -> TrainerInitInfo:
    """The trainer-side init info of this machine's backend: ``gloo_cpu`` on CPU, vLLM's ``nccl`` on CUDA
    (the trainer is rank 0 of a group with the server's ``server_world_size`` workers)."""
    if torch.cuda.is_available():
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        from runkit.net import free_port

        return NCCLTrainerInitInfo(master_address=address, master_port=free_port(address),
                                   world_size=1 + server_world_size, rank=0)
    if server_world_size != 1:
        raise ValueError(f"{BACKEND}: the server has {server_world_size} workers; only one is supported on CPU")
    return GlooTrainerInitInfo(master_address=address, rank=0)


class OfflineClient:
    """The four-call weight-sync client for an in-process ``vllm.LLM`` (its RL methods take request dicts)."""

    def __init__(self, llm):
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: dict) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.finish_weight_update(weight_version)


def register() -> None:
    """Add ``gloo_cpu`` and ``local_cpu`` to vLLM's worker-side and trainer-side weight-transfer registries
    (idempotent). As the
    project's vLLM plugin it runs early in every vLLM process, before the model is built: it also resolves oneMKL's
    vector math there (``llm.models.vml``), so the engine's rotary table is computed by the accurate kernels."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    from llm.models.vml import resolve_vml_dispatch

    resolve_vml_dispatch()

    for name, worker, trainer in ((BACKEND, GlooWeightTransferEngine, GlooTrainerWeightTransferEngine),
                                  (LOCAL_BACKEND, LocalWeightTransferEngine, LocalTrainerWeightTransferEngine)):
        if name not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(name, worker)
        if name not in WeightTransferTrainerFactory._registry:
            WeightTransferTrainerFactory.register_engine(name, trainer)
