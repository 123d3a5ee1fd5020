"""Transformer Engine backend: refusals, recipe validation, module swap and state_dict mapping.

The CPU tests use FAKE_TE, a stand-in for Transformer Engine written here (NOT Transformer Engine:
its Linear is F.linear, its recipes only record their arguments). It checks mxlab's side of the
contract: which modules are swapped, that their forward runs inside TE's autocast with the right
recipe and a padded token count, and how state_dict keys map. The `gpu` tests at the end run
the real TE (install it as shared/te/README.md describes) and are skipped without CUDA or TE.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import importlib
import importlib.util
import json
import types
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from mxlab.experiment.execution import ExecutionOptions
from mxlab.recipe import apply_recipe, load_recipe, parse_recipe
from mxlab.recipe.backends import te as te_backend
from mxlab.recipe.backends.te import BackendUnavailableError, TEHandle, TEPolicy

SHIPPED_TE_RECIPES = {
    "te-fp8-current": "fp8_current",
    "te-fp8-delayed": "fp8_delayed",
    "te-fp8-block": "fp8_block",
    "te-mxfp8": "mxfp8",
}
MXFP8_REFUSAL = "Device compute capability 10.0 or higher required for MXFP8 execution."


# --------------------------------------------------------------------------------- the stand-in
class FakeFormat(enum.Enum):
    E4M3 = "e4m3"
    HYBRID = "hybrid"


class FakeRecipe:
    """Stand-in for a TE recipe dataclass: records its keyword arguments."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs


def _fake_recipe_module() -> types.SimpleNamespace:
    classes = {name: type(name, (FakeRecipe,), {}) for name in te_backend.TE_RECIPE_CLASSES.values()}
    return types.SimpleNamespace(Format=FakeFormat, **classes)


class FakeTE:
    """Stand-in for transformer_engine.pytorch: Linear, autocast and the is_*_available checks."""

    def __init__(self, mxfp8_supported: bool = False):
        self.active_recipes: list[FakeRecipe] = []
        self.mxfp8_supported = mxfp8_supported
        fake = self

        class Linear(nn.Module):
            """Stand-in for te.Linear: TE's constructor keywords, weight/bias Parameters, an _extra_state entry."""

            def __init__(self, in_features, out_features, bias=True, params_dtype=None, device=None):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(out_features, in_features, dtype=params_dtype, device=device))
                self.bias = nn.Parameter(torch.randn(out_features, dtype=params_dtype, device=device)) if bias else None
                self.calls: list[tuple[tuple[int, ...], FakeRecipe | None]] = []
                self.extra_loaded = None

            def forward(self, x):
                assert x.dim() == 2, "TE's Linear gets the flattened 2-D input from mxlab"
                self.calls.append((tuple(x.shape), fake.active_recipes[-1] if fake.active_recipes else None))
                return F.linear(x, self.weight, self.bias)

            def get_extra_state(self):
                return torch.tensor([float(len(self.calls))])

            def set_extra_state(self, state):
                self.extra_loaded = state

        self.Linear = Linear

    @contextlib.contextmanager
    def autocast(self, enabled=True, recipe=None):
        self.active_recipes.append(recipe)
        try:
            yield
        finally:
            self.active_recipes.pop()

    def is_fp8_available(self, return_reason=False):
        return (True, "") if return_reason else True

    def is_fp8_block_scaling_available(self, return_reason=False):
        return (True, "") if return_reason else True

    def is_mxfp8_available(self, return_reason=False):
        reason = "" if self.mxfp8_supported else MXFP8_REFUSAL
        return (self.mxfp8_supported, reason) if return_reason else self.mxfp8_supported


@pytest.fixture
def fake_te(monkeypatch):
    fake = FakeTE()
    handle = TEHandle(pytorch=fake, recipe=_fake_recipe_module(), version="fake", requires_cuda=False)
    monkeypatch.setattr(te_backend, "load_transformer_engine", lambda: handle)
    return fake


@pytest.fixture
def no_te(monkeypatch):
    """Transformer Engine absent, whatever is installed: the backend's imports of it fail."""
    real_import = importlib.import_module

    def import_module(name, package=None):
        if name.split(".")[0] == "transformer_engine":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, package)

    monkeypatch.setattr(te_backend.importlib, "import_module", import_module)


def te_recipe(te_recipe_name: str = "fp8_current", **policy) -> object:
    return parse_recipe(
        {
            "name": "te-test",
            "default": "te",
            "policies": {"te": {"backend": "te", "te_recipe": te_recipe_name, **policy}},
        }
    )


def small_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))


# --------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("name, te_name", sorted(SHIPPED_TE_RECIPES.items()))
def test_shipped_te_recipes_load_as_te_policies(name, te_name):
    recipe = load_recipe(name)
    policy = recipe.policies[recipe.default]
    assert isinstance(policy, TEPolicy) and policy.te_recipe == te_name
    assert te_backend.te_recipe_names(recipe) == [te_name]
    assert policy.describe()["fwd"].startswith(f"TE {te_backend.TE_RECIPE_CLASSES[te_name]}")


def test_te_policy_formats_follow_te_defaults():
    assert te_recipe("fp8_current").policies["te"].operand_formats()["grad_output"] == "E5M2"  # HYBRID
    assert te_recipe("mxfp8").policies["te"].operand_formats()["grad_output"] == "E4M3"  # MXFP8BlockScaling: E4M3
    assert te_recipe("fp8_current", fp8_format="e4m3").policies["te"].operand_formats()["grad_output"] == "E4M3"


@pytest.mark.parametrize(
    "policy, message",
    [
        (
            {"backend": "te", "te_recipe": "fp8"},
            r"unknown TE recipe 'fp8'; accepted: fp8_current, fp8_delayed, fp8_block, mxfp8",
        ),
        ({"backend": "te"}, r"unknown TE recipe None; accepted: fp8_current"),
        ({"backend": "cutlass", "te_recipe": "fp8_current"}, r"unknown backend 'cutlass'; accepted: te"),
        ({"backend": "te", "te_recipe": "fp8_current", "all": "e4m3"}, r"unknown key\(s\) 'all' for backend = \"te\""),
        (
            {"backend": "te", "te_recipe": "fp8_current", "fp8_format": "e5m2"},
            r"fp8_format: unknown 'e5m2'; accepted: hybrid, e4m3",
        ),
        (
            {"backend": "te", "te_recipe": "fp8_current", "unaligned": "pad"},
            r"unaligned: unknown 'pad'; accepted: error, high_precision",
        ),
        (
            {"backend": "te", "te_recipe": "fp8_current", "amax_history_len": 16},
            r"apply to te_recipe = \"fp8_delayed\" only",
        ),
        (
            {"backend": "te", "te_recipe": "fp8_delayed", "amax_history_len": 0},
            r"amax_history_len: must be a positive integer",
        ),
        (
            {"backend": "te", "te_recipe": "fp8_delayed", "amax_compute_algo": "mean"},
            r"unknown 'mean'; accepted: max, most_recent",
        ),
    ],
)
def test_te_policy_validation_names_the_value_and_the_accepted_ones(policy, message):
    with pytest.raises(ValueError, match=message):
        parse_recipe({"name": "bad", "default": "te", "policies": {"te": policy}})


def test_te_and_mxlab_policies_mix_in_one_recipe():
    recipe = parse_recipe(
        {
            "name": "mixed",
            "default": "mx",
            "policies": {"mx": {"all": "e4m3"}, "te": {"backend": "te", "te_recipe": "fp8_delayed"}},
            "rules": [{"match": "0", "policy": "te"}],
        }
    )
    assert not isinstance(recipe.policies["mx"], TEPolicy) and isinstance(recipe.policies["te"], TEPolicy)
    assert te_backend.te_recipe_names(recipe) == ["fp8_delayed"]


# --------------------------------------------------------------------------------- refusals
def test_without_te_apply_recipe_refuses_with_install_instructions_and_swaps_nothing(no_te):
    model = small_model()
    with pytest.raises(BackendUnavailableError, match=r"pip install 'mxlab\[te\]'.*shared/te/README.md"):
        apply_recipe(model, load_recipe("te-fp8-current"))
    assert all(type(module) in (nn.Linear, nn.ReLU, nn.Sequential) for module in model.modules())


def test_without_te_the_reason_also_names_the_missing_cuda(no_te, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = te_backend.recipe_unavailable_reason(load_recipe("te-fp8-current"))
    assert "cannot be imported" in reason and "torch.cuda.is_available() is False" in reason


def test_a_recipe_without_te_policies_needs_nothing(no_te):
    assert te_backend.recipe_unavailable_reason(load_recipe("bf16")) is None


def test_the_recipe_interface_asks_every_backend_and_gives_te_reason(no_te, monkeypatch):
    from mxlab.recipe import unavailable_reason
    from mxlab.recipe.apply import converters_for

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recipe = load_recipe("te-fp8-current")
    assert {
        name: converter.unavailable_reason(recipe, "cpu") for name, converter in converters_for(recipe).items()
    } == {"te": te_backend.recipe_unavailable_reason(recipe, "cpu"), "mxlab": None}
    reason = unavailable_reason(recipe, "cpu")
    assert reason == te_backend.recipe_unavailable_reason(recipe, "cpu") and "cannot be imported" in reason
    assert unavailable_reason(load_recipe("bf16"), "cpu") is None


def test_no_cuda_device_is_refused_even_with_te(monkeypatch):
    fake = FakeTE()
    handle = TEHandle(pytorch=fake, recipe=_fake_recipe_module(), version="fake", requires_cuda=True)
    monkeypatch.setattr(te_backend, "load_transformer_engine", lambda: handle)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendUnavailableError, match=r"CUDA GPUs only and torch.cuda.is_available\(\) is False"):
        apply_recipe(small_model(), te_recipe(unaligned="high_precision"))


def test_a_cpu_device_on_a_cuda_machine_is_refused(monkeypatch):
    handle = TEHandle(pytorch=FakeTE(), recipe=_fake_recipe_module(), version="fake", requires_cuda=True)
    monkeypatch.setattr(te_backend, "load_transformer_engine", lambda: handle)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    reason = te_backend.unavailable_reason(["fp8_current"], device="cpu")
    assert reason == "Transformer Engine runs on CUDA GPUs only; the run's device is cpu"


def test_mxfp8_below_compute_capability_10_is_refused_with_te_reason(monkeypatch):
    handle = TEHandle(
        pytorch=FakeTE(mxfp8_supported=False), recipe=_fake_recipe_module(), version="fake", requires_cuda=True
    )
    monkeypatch.setattr(te_backend, "load_transformer_engine", lambda: handle)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H200")
    reason = te_backend.recipe_unavailable_reason(load_recipe("te-mxfp8"), device="cuda:0")
    assert reason == (
        f"TE recipe 'mxfp8' (MXFP8BlockScaling) cannot run on NVIDIA H200 (compute capability 9.0): {MXFP8_REFUSAL}"
    )
    assert te_backend.recipe_unavailable_reason(load_recipe("te-fp8-current"), device="cuda:0") is None


def test_unaligned_modules_are_refused_by_default_naming_module_and_fixes(fake_te):
    model = small_model()
    with pytest.raises(
        ValueError, match=r"2 \(out_features 1; fp8_current needs multiples of 16\).*unaligned = \"high_precision\""
    ):
        apply_recipe(model, te_recipe())
    assert type(model[0]) is nn.Linear  # refused before any swap


# --------------------------------------------------------------------------------- swap and run
def test_apply_recipe_swaps_aligned_linears_for_te_and_the_plan_says_so(fake_te):
    model = small_model()
    plan = apply_recipe(model, te_recipe("fp8_delayed", unaligned="high_precision", amax_history_len=16))
    drawn_after_swap = torch.rand(4)
    reference = small_model()
    assert torch.equal(drawn_after_swap, torch.rand(4))  # TE's own weight init left the RNG as it was
    assert te_backend.te_module_names(model) == ["0"]
    assert isinstance(model[0], fake_te.Linear) and type(model[2]) is nn.Linear
    assert torch.equal(model[0].weight, reference[0].weight) and torch.equal(model[0].bias, reference[0].bias)
    assert model[0].weight is not reference[0].weight
    entries = {entry.module: entry for entry in plan.entries}
    assert entries["0"].backend == "te" and entries["0"].quantized
    assert (
        entries["2"].backend == "mxlab"
        and not entries["2"].quantized
        and "out_features 1 not a multiple of 16" in entries["2"].note
    )
    assert plan.to_dict()["backends"] == {"0": "te"}
    assert "backend te" in plan.table()
    te_recipe_object = model[0].mxlab_te_recipe
    assert type(te_recipe_object).__name__ == "DelayedScaling"
    assert te_recipe_object.kwargs == {
        "fp8_format": FakeFormat.HYBRID,
        "amax_history_len": 16,
        "amax_compute_algo": "max",
    }


def test_te_forward_runs_under_te_autocast_with_tokens_padded_and_matches_the_plain_model(fake_te):
    model, reference = small_model(), small_model()
    fake_te.mxfp8_supported = True
    apply_recipe(model, te_recipe("mxfp8", unaligned="high_precision"))
    x = torch.randn(3, 5, 32)  # 15 tokens: padded to 32 for mxfp8
    y, y_ref = model(x), reference(x)
    assert model[0].calls == [((32, 32), model[0].mxlab_te_recipe)]
    assert type(model[0].mxlab_te_recipe).__name__ == "MXFP8BlockScaling"
    assert model[0].mxlab_te_recipe.kwargs == {"fp8_format": FakeFormat.E4M3}
    assert y.shape == (3, 5, 1) and torch.allclose(y, y_ref, atol=1e-6)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    assert torch.allclose(model[0].weight.grad, reference[0].weight.grad, atol=1e-5)
    copied = copy.deepcopy(model)  # e.g. an EMA copy: shares the TE handle, owns its weights
    assert copied[0].mxlab_te_handle is model[0].mxlab_te_handle and copied[0].weight is not model[0].weight
    # an empty batch still reaches TE with one aligned block of zero rows, and comes back empty
    assert model(torch.randn(0, 32)).shape == (0, 1)


def test_shipped_te_recipe_on_the_tiny_gem_model_keeps_unaligned_layers_high_precision(fake_te):
    from mxlab.data import make_source
    from mxlab.models import build_model, esmm_loss

    source = make_source({"source": "synthetic", "train_examples": 256, "eval_examples": 64}, 32)
    torch.manual_seed(0)
    model = build_model({"size": "tiny", "max_history": 32}, source.info)
    plan = apply_recipe(model, load_recipe("te-fp8-current"))
    kept = {entry.module: entry.note for entry in plan.entries if entry.kind == "linear" and entry.backend == "mxlab"}
    assert set(kept) == {"dense_proj", "towers.ctr.out", "towers.cvr.out"}  # in_features 4, out_features 1
    assert "in_features 4 not a multiple of 16" in kept["dense_proj"]
    assert set(plan.to_dict()["backends"]) == set(te_backend.te_module_names(model))
    assert "history.blocks.0.attn.qkv" in plan.to_dict()["backends"]
    batch = next(source.train_batches(64, 0, 0))
    esmm_loss(model(batch), batch)["loss"].backward()
    te_modules = [module for module in model.modules() if te_backend.is_te_module(module)]
    assert all(module.calls and module.weight.grad is not None for module in te_modules)
    assert all(
        rows % 16 == 0 and type(recipe).__name__ == "Float8CurrentScaling"
        for module in te_modules
        for (rows, _), recipe in module.calls
    )


# --------------------------------------------------------------------------------- state_dict
def test_state_dict_maps_both_ways_between_te_and_plain_models(fake_te):
    te_model = small_model()
    apply_recipe(te_model, te_recipe(unaligned="high_precision"))
    te_model(torch.randn(16, 32))  # the fake's extra state counts calls: 1.0
    te_state = te_model.state_dict()
    assert set(te_state) == {"0.weight", "0.bias", "0._extra_state", "2.weight", "2.bias"}

    plain_state = te_backend.te_state_dict_to_plain(te_state, te_backend.te_module_names(te_model))
    plain_model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    plain_model.load_state_dict(plain_state)  # strict
    assert torch.equal(plain_model[0].weight, te_model[0].weight)

    with torch.no_grad():
        plain_model[0].weight.add_(1.0)
    other_te = small_model()
    apply_recipe(other_te, te_recipe(unaligned="high_precision"))
    mapped = te_backend.plain_state_dict_to_te(plain_model.state_dict(), other_te)
    other_te.load_state_dict(mapped)  # strict
    assert torch.equal(other_te[0].weight, plain_model[0].weight)
    assert torch.equal(other_te[0].extra_loaded, torch.tensor([0.0]))  # its own extra state, kept

    with pytest.raises(ValueError, match=r"missing \['0.bias'\]"):
        te_backend.plain_state_dict_to_te(
            {k: v for k, v in plain_model.state_dict().items() if k != "0.bias"}, other_te
        )


# --------------------------------------------------------------------------------- runner
def test_the_runner_records_an_arm_te_cannot_run_as_skipped(no_te, tmp_path):
    from mxlab.experiment.train import RunJob, run_is_done, train_run

    job = RunJob(
        arm="te-fp8-current",
        seed=0,
        recipe=load_recipe("te-fp8-current"),
        recipe_source="te-fp8-current",
        run_dir=tmp_path / "runs" / "te-fp8-current" / "seed0",
        spec=types.SimpleNamespace(train=None),
    )
    result = train_run(job, source=None, device="cpu")
    assert result.status == "skipped" and "pip install 'mxlab[te]'" in result.reason
    done = json.loads((job.run_dir / "done.json").read_text())
    assert done["status"] == "skipped" and done["reason"] == result.reason and done["steps"] == 0
    assert not run_is_done(job.run_dir)  # tried again when the study is resumed


# --------------------------------------------------------------------------------- check te, bench linear (CPU parts)
def test_check_te_refuses_without_te_or_cuda_and_says_how_to_install(no_te):
    from typer.testing import CliRunner

    from mxlab.cli import app
    from mxlab.recipe.backends.te_check import run_te_check

    with pytest.raises(BackendUnavailableError, match=r"pip install 'mxlab\[te\]'"):
        run_te_check()
    result = CliRunner().invoke(app, ["check", "te"])
    assert result.exit_code == 2
    assert "cannot run here" in result.output and "shared/te/README.md" in result.output


def test_check_te_classifies_every_difference():
    from mxlab.recipe.backends.te_check import classify_differences

    e4m3 = torch.float8_e4m3fn
    same = torch.tensor([1.0, -2.0, 0.0])
    assert classify_differences(same, same.clone(), True, e4m3, 1.0, 1.0) == []
    assert classify_differences(torch.tensor([1.0, 2.0]), torch.tensor([1.125, 2.0]), True, e4m3, 1.0, 1.0) == [
        "one_step: 1 elements one FP8 step apart (rounding of x * scale)"
    ]
    assert classify_differences(torch.tensor([1.0, 2.0]), torch.tensor([1.5, 2.0]), True, e4m3, 1.0, 1.0) == [
        "unexplained: 1 elements"
    ]
    assert classify_differences(torch.tensor([1.0, 2.0]), torch.tensor([float("nan"), 2.0]), True, e4m3, 1.0, 1.0) == [
        "nonfinite: 1 elements NaN/Inf in one result only"
    ]
    assert classify_differences(torch.tensor([1.0, 2.0]), torch.tensor([1.5, 3.0]), False, e4m3, 0.5, 0.75)[
        0
    ].startswith("scale: 2 elements follow a different scale")


def test_check_te_tie_case_lies_exactly_halfway_between_e4m3_neighbours():
    from mxlab.numerics.quant import fake_quantize
    from mxlab.recipe.backends.te_check import make_case

    x = make_case("ties", 64, 64, torch.Generator().manual_seed(0)).float()
    assert x.abs().max() == 448.0  # per-tensor scale 448 / amax = 1
    quantized = fake_quantize(x, "fp8_tensor_e4m3")
    half_step = torch.exp2(torch.floor(torch.log2(x.abs()))) / 16
    off = (quantized - x).abs()
    assert off[0, 0] == 0 and torch.equal(off.flatten()[1:], half_step.flatten()[1:])


def test_relative_error_edges():
    from mxlab.recipe.backends.te_check import relative_error

    assert relative_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert relative_error(torch.ones(3), torch.zeros(3)) == float("inf")
    assert relative_error(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 0.0])) == pytest.approx(4.0 / 3.0)


def test_bench_linear_parses_shapes_and_refuses_without_cuda(monkeypatch):
    from typer.testing import CliRunner

    from mxlab.bench.linear import DEFAULT_SHAPES, parse_shape, run_linear_bench
    from mxlab.cli import app

    assert parse_shape("65536x512x1024") == (65536, 512, 1024)
    assert {(m, k) for m, k, _ in DEFAULT_SHAPES} == {(m, k) for m in (16384, 65536) for k in (512, 1024, 4096)}
    with pytest.raises(ValueError, match=r"shape '16x32': expected MxKxN"):
        parse_shape("16x32")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"torch.cuda.is_available\(\) is False"):
        run_linear_bench()
    result = CliRunner().invoke(app, ["bench", "linear", "--shape", "16x32x32"])
    assert result.exit_code == 2 and "CUDA" in result.output


# --------------------------------------------------------------------------------- GPU + real TE
def _te_importable() -> bool:
    try:
        return importlib.util.find_spec("transformer_engine") is not None
    except (ImportError, ValueError):
        return False


needs_te = pytest.mark.skipif(
    not (torch.cuda.is_available() and _te_importable()), reason="needs CUDA and Transformer Engine"
)


def _te_study_spec(tmp_path: Path, arms: list[str], train_examples: int, eval_examples: int = 4096) -> Path:
    """A tiny-model study spec in tmp_path, with the shipped recipes of `arms` copied next to it."""
    import shutil

    shipped = Path(__file__).resolve().parents[2] / "experiments" / "recipes"
    (tmp_path / "recipes").mkdir()
    for arm in arms:
        shutil.copy(shipped / f"{arm}.toml", tmp_path / "recipes" / f"{arm}.toml")
    spec_path = tmp_path / "te.toml"
    spec_path.write_text(
        f'name = "te-tiny"\nseeds = [0]\nbaseline = "bf16"\narms = {json.dumps(arms)}\n'
        f'[data]\nsource = "synthetic"\ntrain_examples = {train_examples}\neval_examples = {eval_examples}\n'
        '[model]\nsize = "tiny"\nmax_history = 32\n'
        "[train]\nbatch_size = 256\nlr = 3e-3\nepochs = 1\neval_batch_size = 2048\nlog_every = 2\n"
    )
    return spec_path


def test_a_study_trains_a_te_arm_and_skips_one_the_gpu_cannot_run_with_the_reason_in_the_report(fake_te, tmp_path):
    """Through the real runner and report, with FAKE_TE standing in for TE (its MXFP8 is unsupported)."""
    from mxlab.experiment import load_spec
    from mxlab.experiment.runner import run_study

    spec = load_spec(
        _te_study_spec(tmp_path, ["bf16", "te-fp8-current", "te-mxfp8"], train_examples=256, eval_examples=2048)
    )
    run_study(spec, tmp_path / "study", device="cpu", show_progress=False, options=ExecutionOptions(executor="inline"))
    from mxlab.report import write_report

    write_report(tmp_path / "study")
    runs = tmp_path / "study" / "runs"
    assert json.loads((runs / "bf16" / "seed0" / "done.json").read_text())["status"] == "finished"
    te_run = runs / "te-fp8-current" / "seed0"
    assert json.loads((te_run / "done.json").read_text())["status"] == "finished"
    assert "history.blocks.0.attn.qkv" in json.loads((te_run / "plan.json").read_text())["backends"]
    checkpoint = torch.load(te_run / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert "history.blocks.0.attn.qkv._extra_state" in checkpoint["model"]  # TE's state is saved with the run
    skipped = json.loads((runs / "te-mxfp8" / "seed0" / "done.json").read_text())
    assert skipped["status"] == "skipped" and skipped["reason"].endswith(MXFP8_REFUSAL)
    report = (tmp_path / "study" / "report.md").read_text()
    assert "te-mxfp8 was skipped** on seeds [0]" in report and MXFP8_REFUSAL in report


@pytest.mark.gpu
@needs_te
def test_gpu_te_arm_trains_the_tiny_model(tmp_path):
    from mxlab.experiment import load_spec
    from mxlab.experiment.runner import run_study

    spec_path = _te_study_spec(tmp_path, ["bf16", "te-fp8-current", "te-fp8-delayed", "te-mxfp8"], train_examples=2048)
    spec = load_spec(spec_path)
    run_study(spec, tmp_path / "study", device="cuda", show_progress=False)

    def losses(arm: str) -> list[float]:
        path = tmp_path / "study" / "runs" / arm / "seed0" / "metrics.jsonl"
        return [json.loads(line)["loss"] for line in path.read_text().splitlines()]

    for arm in ("te-fp8-current", "te-fp8-delayed"):
        run_dir = tmp_path / "study" / "runs" / arm / "seed0"
        assert json.loads((run_dir / "done.json").read_text())["status"] == "finished"
        plan = json.loads((run_dir / "plan.json").read_text())
        assert "history.blocks.0.attn.qkv" in plan["backends"] and "towers.ctr.out" not in plan["backends"]
        assert all(torch.isfinite(torch.tensor(losses(arm))))
        assert abs(losses(arm)[-1] - losses("bf16")[-1]) < 0.1 * losses("bf16")[-1]  # FP8 trains like BF16 here
    mxfp8 = json.loads((tmp_path / "study" / "runs" / "te-mxfp8" / "seed0" / "done.json").read_text())
    major, _ = torch.cuda.get_device_capability()
    assert mxfp8["status"] == ("finished" if major >= 10 else "skipped")
    if major < 10:
        assert "compute capability 10.0" in mxfp8["reason"]
    assert (tmp_path / "study" / "report.md").is_file()


@pytest.mark.gpu
@needs_te
def test_gpu_bench_linear_times_bf16_emulation_and_te_on_one_shape():
    from mxlab.bench.linear import BASELINE, run_linear_bench

    results = {r.arm: r for r in run_linear_bench([(16384, 1024, 1024)], repeat=3, echo=lambda text: None)}
    assert results[BASELINE].ratio_to_bf16 == 1.0
    assert results["mxlab mxfp8 (emulated)"].ms is not None and results["TE fp8_current"].ms is not None
    major, _ = torch.cuda.get_device_capability()
    assert (results["TE mxfp8"].ms is None) == (major < 10)


@pytest.mark.gpu
@needs_te
def test_gpu_check_te_per_tensor_fp8_is_bit_identical_or_every_difference_is_explained():
    from mxlab.recipe.backends.te_check import run_te_check

    report = run_te_check(seed=0)
    per_tensor = [row for row in report.operands if row.scheme.startswith("fp8_current")]
    assert per_tensor, report.table()
    for row in per_tensor:
        assert row.identical_fraction == 1.0 or (row.differences and "unexplained" not in " ".join(row.differences)), (
            report.table()
        )
    random_rows = [row for row in per_tensor if row.case in ("normal", "heavy_tail")]
    assert all(row.identical_fraction == 1.0 for row in random_rows), report.table()
    assert all(row.rel_error_te_vs_mxlab < 0.02 for row in report.gemms if row.scheme == "fp8_current"), report.table()
