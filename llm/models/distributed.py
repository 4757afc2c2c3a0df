"""Several trainer processes: ``torchrun --nproc-per-node N -m llm train ...`` (torch.distributed: gloo on CPU,
NCCL on CUDA), data-parallel over the prompts of a step.

Every rank holds the whole policy and the same optimiser state (the same initial weights, the same updates).
Rank 0 alone talks to the sampler (generation and weight syncs), scores the completions, and writes metrics,
checkpoints and the final model; the step's prompts, completions and rewards are broadcast to every rank. Each rank
runs the forward and backward passes of its share of the prompts (contiguous, by prompt, so a group never spans
two ranks), with the loss weights computed from the whole step, so the sum of the ranks' gradients (all-reduced)
is the one-process gradient of the whole step. Per-token results of no-gradient passes (log pi_k, log alpha, pi_ref,
pi_{k+1}, entropies) are summed over ranks into whole-batch tensors, so every metric is computed over the global
batch, never rank 0's share; hidden states stay with their rank and the token-level TV sums are reduced as numbers.
With one process (no torchrun) nothing here runs: ``SINGLE`` does no communication.

FSDP (``--fsdp``, ``shard_blocks``): the transformer blocks of every model copy (policy, alpha, alpha's successor,
pi_ref) are sharded over the ranks with PyTorch's FSDP2: each rank stores 1/N of every block's weights, gradients
and Adam moments and gathers a block's weights for its forward and backward. The rest (embeddings, final norm,
output layer) stays whole on every rank, as in data parallel, because the chunked log-probs (``llm.tensors.logprobs``)
apply the output layer outside the model's forward. What changes for the step:

- every rank runs every forward and backward pass of a model (a block's gather needs every rank): a rank with fewer
  passes in its share runs idle passes over one row, whose results are dropped (``Ranks.idle_passes``);
- the blocks' gradients are summed by FSDP's reduce-scatter (divide factor 1), the whole weights' by ``sum_grads``;
  the gradient norm adds the shards' squares over ranks (``grad_norm``);
- checkpoints hold whole tensors in the one-process layout (``whole_state_dict``, ``whole_optimizer_state``), so a
  run may resume with or without FSDP and with any number of ranks (``load_whole_state_dict``,
  ``load_whole_optimizer_state``);
- the sampler's syncs, evaluation and the final model take the gathered weights from rank 0's one unsharded copy,
  in CPU memory (``gather_into``).

Faults: a rank that dies leaves the others in a collective, which fails (gloo: the peer's connection closes) or
times out after ``COLLECTIVE_TIMEOUT_S``; each surviving rank then stops with one line (``RunError``; under FSDP the
trainer turns the transport's error in FSDP's own collectives into the same line, ``collective_failure``), and
torchrun ends the job (a rank it terminates with SIGTERM says so in one line). Rank 0 writes checkpoints atomically,
so the last one is intact; the same command resumes. A different number of ranks may resume it too: the global batch
and its gradient do not depend on the split.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import math
import os
import signal
import threading
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from runkit.cli import RunError, first_line

#: Seconds a rank waits in a collective before giving up (a rank that died leaves the others waiting).
COLLECTIVE_TIMEOUT_S = 600


@dataclass(frozen=True)
class Ranks:
    """This process's rank among ``world`` trainer processes."""

    rank: int = 0
    world: int = 1
    fsdp: bool = False
    """The transformer blocks are sharded over the ranks (``shard_blocks``)."""
    backend: str = ""
    """The backend of the process group ``init_ranks`` made (``process_group_backend``), '' without one; with one,
    collectives run even with one rank (``--nproc-per-node 1``)."""

    @property
    def active(self) -> bool:
        return self.world > 1 or bool(self.backend)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def joins_rank0(self) -> bool:
        """This rank runs the passes rank 0 runs alone without FSDP (exact J, evaluation): rank 0, or every rank
        under FSDP, where each pass needs all of them."""
        return self.main or self.fsdp

    def prompts(self, n: int) -> range:
        """This rank's share of ``n`` prompts: a contiguous range, sizes differing by at most one."""
        return range(self.rank * n // self.world, (self.rank + 1) * n // self.world)

    def rows(self, n_sequences: int, group: int) -> torch.Tensor | None:
        """Row indices of this rank's share of a batch of ``n_sequences`` = prompts x ``group`` sequences (prompt-
        major); None with one process (every row)."""
        if not self.active:
            return None
        share = self.prompts(n_sequences // group)
        return torch.arange(share.start * group, share.stop * group)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum over ranks (in place)."""
        if self.active:
            with self.collective():
                torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
        return tensor

    @contextlib.contextmanager
    def collective(self):
        """A collective operation; its failure (another rank died or timed out) becomes one line."""
        try:
            yield
        except RuntimeError as exc:
            raise self.fault(exc) from None

    def fault(self, exc: BaseException) -> RunError:
        """The one line a rank stops with when a collective failed (FSDP's own gathers included); a RunError is
        already one (torchrun's SIGTERM raised it during the collective) and stays as it is."""
        if isinstance(exc, RunError):
            return exc
        return RunError(f"rank {self.rank} of {self.world}: another trainer process stopped or stalled "
                        f"({type(exc).__name__}: {first_line(exc, 160)}); this run ends; the last checkpoint in "
                        "output_dir is intact and the same command resumes from it")

    def terminated(self, signum, frame) -> None:
        """SIGTERM: torchrun ends every process of the job when one of them fails (or torchrun itself is
        interrupted); a rank busy outside a collective then stops with one line instead of dying silently."""
        raise RunError(f"rank {self.rank} of {self.world}: ended by torchrun (another trainer process stopped, or "
                       "torchrun was interrupted; its report follows); the last checkpoint in output_dir is intact "
                       "and the same command resumes from it")

    def sum_float(self, value: float) -> float:
        if not self.active:
            return value
        return float(self.sum(torch.tensor([value], dtype=torch.float64)))

    def max_float(self, value: float) -> float:
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        with self.collective():
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t)

    def idle_passes(self, n: int) -> int:
        """Passes a rank with ``n`` passes in its share must add so that every rank runs as many (FSDP: a sharded
        block's forward and backward need every rank); 0 without FSDP."""
        return int(self.max_float(n)) - n if self.fsdp else 0

    def sum_grads(self, parameters) -> None:
        """Sum the gradients over ranks; a parameter without a gradient on this rank (no loss token here)
        contributes zeros. Sharded parameters' gradients are skipped: FSDP's reduce-scatter summed them."""
        if not self.active:
            return
        for p in parameters:
            if p.requires_grad and not isinstance(p, DTensor):
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                with self.collective():
                    torch.distributed.all_reduce(p.grad, op=torch.distributed.ReduceOp.SUM)

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank (pickled; small objects: prompts, completions, rewards)."""
        if not self.active:
            return obj
        box = [obj if self.main else None]
        with self.collective():
            torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def from_main(self, fn):
        """``fn()`` run on rank 0 alone (generation, scoring), its result on every rank."""
        return self.broadcast(fn() if self.main else None)

    def barrier(self) -> None:
        if self.active:
            with self.collective():
                torch.distributed.barrier()

    def grad_norm(self, parameters) -> float:
        """The global L2 norm of the gradients, accumulated in float64 (a float32 sum of squares overflows for
        elements above 1.8e19); inf or nan if any gradient element is. A sharded gradient's squares are added over
        the ranks (each holds one shard); a whole one counts once (every rank holds the same sum)."""
        whole, shards = [], []
        for p in parameters:
            if p.grad is not None:
                g = p.grad
                (shards if isinstance(g, DTensor) else whole).append(
                    torch.linalg.vector_norm(local(g), dtype=torch.float64))
        if not shards:
            return float(torch.linalg.vector_norm(torch.stack(whole))) if whole else 0.0
        squares = self.sum_float(float(torch.stack(shards).square().sum()))
        return math.sqrt(squares + (float(torch.stack(whole).square().sum()) if whole else 0.0))


SINGLE = Ranks()


def collective_failure(exc: BaseException) -> bool:
    """True for the error of a collective whose peer died or stalled: torch.distributed's own error types, or a
    RuntimeError raised by the gloo or NCCL transport (FSDP's and DTensor's collectives raise those as they are)."""
    if isinstance(exc, RunError):  # already the one line
        return False
    if isinstance(exc, torch.distributed.DistError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(k in text for k in ("gloo", "NCCL", "nccl", "Connection reset",
                                                                     "Connection closed"))


def gathered(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered whole (a collective: every rank calls it); any other tensor itself."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded tensor (a view: writing to it writes the shard); any other tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def clip_gradients(parameters, max_norm: float, total_norm: float) -> None:
    """Scale the gradients by min(1, max_norm / (total_norm + 1e-6)), as ``torch.nn.utils.clip_grads_with_norm_``
    (which it calls when no gradient is sharded; its fused path refuses sharded and whole gradients together)."""
    params = list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not any(isinstance(g, DTensor) for g in grads):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, torch.tensor(total_norm))
        return
    coef = torch.clamp(max_norm / (torch.tensor(total_norm) + 1e-6), max=1.0)
    for g in grads:
        local(g).mul_(coef.to(g.device))


def transformer_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder's list of transformer blocks (``layers``, or GPT-2's ``h``)."""
    decoder = model.get_decoder()
    for name in ("layers", "h"):
        blocks = getattr(decoder, name, None)
        if isinstance(blocks, torch.nn.ModuleList) and len(blocks):
            return blocks
    raise ValueError(f"fsdp: {type(model).__name__}'s decoder has no list of transformer blocks ('layers' or 'h') "
                     "to shard; run without --fsdp")


def shard_blocks(model: torch.nn.Module) -> torch.nn.Module:
    """Shard ``model``'s transformer blocks over the ranks (FSDP2, in place; each block one unit, its weights
    gathered for its forward and freed after it) with the decoder as the root unit; every other weight (embeddings,
    final norm, output layer) stays whole on every rank. Gradients are summed over the ranks, as without FSDP."""
    from torch.distributed.fsdp import fully_shard

    blocks = transformer_blocks(model)
    for block in blocks:
        fully_shard(block, reshard_after_forward=True)
        block.set_gradient_divide_factor(1.0)  # a plain sum (float32 would otherwise use a pre-multiplied
        block.set_force_sum_reduction_for_comms(True)  # sum, which gloo lacks)
    in_blocks = {id(p) for p in blocks.parameters()}
    whole = {p for p in model.parameters() if id(p) not in in_blocks}
    fully_shard(model.get_decoder(), reshard_after_forward=True, ignored_params=whole)
    return model


@torch.no_grad()
def whole_state_dict(model: torch.nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with every sharded tensor gathered whole (on the CPU): the one-process layout. A
    collective under FSDP (every rank calls it); ``keep`` False (ranks that write nothing): an empty dict, each
    gathered tensor dropped at once."""
    out = {}
    for key, value in model.state_dict().items():
        whole = gathered(value).cpu() if isinstance(value, DTensor) else value
        if keep:
            out[key] = whole
    return out


def shard_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A whole tensor cut as ``like`` (a sharded tensor of the same shape) is: this rank's shard of it, locally."""
    if not isinstance(like, DTensor):
        return value
    return distribute_tensor(value.to(like.device, like.dtype), like.device_mesh, like.placements, src_data_rank=None)


def load_whole_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """model <- ``state`` in the one-process layout (``whole_state_dict``), each rank keeping its shards."""
    own = model.state_dict()
    model.load_state_dict({k: shard_like(state[k], v) for k, v in own.items()} if any(
        isinstance(v, DTensor) for v in own.values()) else state)


def _optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def whole_optimizer_state(optimizer: torch.optim.Optimizer, keep: bool = True) -> dict:
    """``optimizer.state_dict()`` with the sharded moments gathered whole: the one-process layout (the parameters
    are in the same order; a collective under FSDP)."""
    state = optimizer.state_dict()
    if not any(isinstance(p, DTensor) for p in _optimizer_params(optimizer)):
        return state
    whole = {}
    for i in sorted(state["state"]):  # the same order on every rank; new dicts (these are the optimiser's own)
        entry = state["state"][i]
        moments = {name: gathered(entry[name]).cpu() if isinstance(entry[name], DTensor) else entry[name]
                   for name in sorted(entry)}
        if keep:  # else each entry's gathered moments are dropped at once
            whole[i] = moments
    return {**state, "state": whole} if keep else {}


def load_whole_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """optimizer <- ``state`` in the one-process layout, each rank keeping the shards of its sharded parameters."""
    params = _optimizer_params(optimizer)
    entries = {i: {name: shard_like(v, params[i]) if torch.is_tensor(v) and v.shape == params[i].shape else v
                   for name, v in entry.items()} for i, entry in state["state"].items()}
    optimizer.load_state_dict({**state, "state": entries})


@torch.no_grad()
def gather_into(dst: torch.nn.Module | None, src: torch.nn.Module) -> None:
    """dst <- ``src``'s weights gathered whole (FSDP: a collective, every rank calls it; ``dst`` None on ranks that
    only take part), tensor by tensor, so a rank holds at most one gathered tensor besides ``dst``."""
    params = dict(dst.named_parameters()) if dst is not None else {}
    for name, value in src.state_dict().items():
        value = gathered(value)
        if name in params:
            params[name].copy_(value)


#: A process group was initialised in this process (``init_ranks``): ``llm.train`` then leaves with ``os._exit``.
_grouped: list[bool] = []


def ran_in_a_group() -> bool:
    return bool(_grouped)


def under_torchrun() -> bool:
    """This process is a worker torchrun started (torchrun sets TORCHELASTIC_RUN_ID, with RANK and MASTER_ADDR)."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "MASTER_ADDR" in os.environ


def process_group_backend(device: torch.device) -> str:
    """gloo on a CPU; on CUDA, NCCL for CUDA tensors and gloo for CPU ones (the float64 scalars of ``sum_float`` and
    ``max_float``, which NCCL refuses: "No backend type associated with device type cpu", seen on an H200)."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def init_ranks(device: torch.device, fsdp: bool = False, group_of_one: bool = True) -> Ranks:
    """The ranks torchrun started (WORLD_SIZE, RANK in the environment), with the process group initialised: gloo on
    CPU, NCCL and gloo on CUDA (``process_group_backend``; each rank on cuda:LOCAL_RANK). ``torchrun
    --nproc-per-node 1`` makes a group of one whose collectives run (so one GPU exercises NCCL and FSDP), unless
    ``group_of_one`` is False and ``fsdp`` off (the in-process vLLM engine, which sets up torch.distributed itself:
    one process runs as without torchrun). Without torchrun: ``SINGLE``; ``fsdp`` without torchrun is refused."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and not (under_torchrun() and (group_of_one or fsdp)):
        if fsdp:
            raise ValueError("fsdp: shards the model over torchrun's trainer processes; start the run with "
                             "torchrun --nproc-per-node N -m llm train ..., or drop --fsdp")
        return SINGLE
    rank = int(os.environ["RANK"])
    backend = process_group_backend(device)
    if not torch.distributed.is_initialized():
        device_id = None
        if device.type == "cuda":
            device_id = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device_id)
        torch.distributed.init_process_group(backend, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                                             device_id=device_id)
    ranks = Ranks(rank, world, fsdp, backend=backend)
    _grouped.append(True)
    if threading.current_thread() is threading.main_thread():
        _previous_sigterm.append(signal.signal(signal.SIGTERM, ranks.terminated))
    return ranks


#: The SIGTERM handler ``init_ranks`` replaced, put back by ``close_ranks``.
_previous_sigterm: list = []


def close_ranks(ranks: Ranks, finished: bool = True) -> None:
    """Tear down the process group. After a run that ``finished`` on every rank, first a barrier: no rank closes its
    connections while another still completes a collective with it (without it, a rank that left early was
    aborted at exit, "terminate called without an active exception", in about 1 of 8 runs of the FSDP tests).
    After an error no barrier: the other ranks may be gone."""
    if ranks.active and torch.distributed.is_initialized():
        gc.collect()  # FSDP's modules are cyclic garbage by now: freed here, with their pending gloo work, not at exit
        if finished:
            ranks.barrier()
        torch.distributed.destroy_process_group()
    if _previous_sigterm and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _previous_sigterm.pop())

