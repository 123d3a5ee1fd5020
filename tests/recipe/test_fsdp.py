"""FSDP2 (`fully_shard`) of a recipe-applied model over two gloo processes on the CPU trains to the parameters of
the unsharded model; a model sharded before apply_recipe is refused by name. (DDP: tests/experiment/test_ddp.py.)"""

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from mxlab.nn.linear import QLinear
from mxlab.recipe import apply_recipe

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
BATCH, STEPS = 64, 3  # 32 rows per rank: each rank's wgrad blocks (32 rows along the batch) are blocks of the batch


class ParameterProduct(nn.Module):
    """A GEMM site: `x @ w` on a Parameter, emulated by the recipe's GEMM sites rather than a module swap."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, dim) / dim**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.w)


def _model(recipe: str | None) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), ParameterProduct(64), nn.Linear(64, 32))
    if recipe is not None:
        apply_recipe(model, recipe)
    return model


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(BATCH, 64, generator=generator), torch.randn(BATCH, 32, generator=generator)) for _ in range(3)
    ]


def _train(model: nn.Module, rows: slice) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in _batches():
        optimizer.zero_grad()
        (model(x[rows]) - y[rows]).square().mean().backward()
        optimizer.step()


def _sharded_worker(rank: int, world: int, port: int, recipe: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        model = _model(recipe)
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        assert isinstance(model[0], QLinear) and model[0].precision is not None
        per_rank = BATCH // world
        _train(model, slice(rank * per_rank, (rank + 1) * per_rank))
        state = {key: value.full_tensor() for key, value in model.state_dict().items()}
        if rank == 0:
            torch.save(state, out)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_fully_shard_of_a_recipe_applied_model_trains_to_the_unsharded_parameters(tmp_path):
    reference, plain = _model("mxfp8-rceil"), _model(None)
    _train(reference, slice(None))
    _train(plain, slice(None))
    out = tmp_path / "sharded.pt"
    mp.start_processes(_sharded_worker, args=(2, _free_port(), "mxfp8-rceil", str(out)), nprocs=2, start_method="fork")
    sharded = torch.load(out, weights_only=True)
    assert sharded.keys() == reference.state_dict().keys()
    for key, expected in reference.state_dict().items():
        # the emulated GEMMs sum products of MX values, which float32 holds exactly here, in any order; a bias
        # gradient is a plain float32 sum of the output gradient, reduced per rank and then across ranks
        if key.endswith("bias"):
            torch.testing.assert_close(sharded[key], expected, rtol=1e-6, atol=1e-7, msg=key)
        else:
            assert torch.equal(sharded[key], expected), key
        assert not torch.equal(sharded[key], plain.state_dict()[key]), f"{key} trained as the unquantized model"


@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_model_sharded_before_apply_recipe_is_refused_by_name(one_process_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = _model(None)
    mesh = init_device_mesh("cpu", (1,))
    fully_shard(model[2], mesh=mesh)
    with pytest.raises(ValueError, match=r"module\(s\) 2 are already sharded \(FSDP2 fully_shard.*then fully_shard"):
        apply_recipe(model, "mxfp8-rceil")
    assert type(model[0]) is nn.Linear  # refused before any swap
