import json
from pathlib import Path

import pytest
import torch
from torch import nn

from mxlab.nn.attention import JaggedAttention
from mxlab.nn.linear import QLinear
from mxlab.nn.qmatmul import MatmulPrecision
from mxlab.recipe import (
    AttentionPolicy,
    Recipe,
    apply_recipe,
    available_recipes,
    describe_recipe,
    load_recipe,
    load_rounding_state,
    parse_recipe,
    quantizable_modules,
    rounding_state,
    single_layer_recipe,
)

RECIPE_DIR = Path(__file__).resolve().parents[2] / "experiments" / "recipes"
SHIPPED = [
    "bf16",
    "mxfp8-floor",
    "mxfp8-rceil",
    "mxfp8-rceil-sr",
    "mxfp8-square32",
    "mxfp8-wgrad-bf16",
    "mxfp8-tail-bf16",
    "mxfp8-e5m2-grad",
    "mxfp8-hadamard",
    "mxfp4-all",
    "fp8-tensor",
]
DIM, HEADS = 32, 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(DIM, 3 * DIM)
        self.attn.core = JaggedAttention(backend="reference")
        self.attn.proj = nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        q, k, v = self.attn.qkv(x).view(-1, 3, HEADS, DIM // HEADS).unbind(1)
        x = x + self.attn.proj(self.attn.core(q, k, v, offsets, offsets).reshape(-1, DIM))
        return x + self.mlp(x)


class TinyGem(nn.Module):
    """GEM-shaped names: history.blocks.N.attn.{qkv,core,proj}, history.blocks.N.mlp.*,
    towers.{ctr,cvr}.{hidden,out}."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.history = nn.Module()
        self.history.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.towers = nn.ModuleDict({task: nn.Sequential() for task in ("ctr", "cvr")})
        for tower in self.towers.values():
            tower.hidden = nn.Linear(DIM, 20)  # odd width: padded for quantization
            tower.act = nn.ReLU()
            tower.out = nn.Linear(20, 1)

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        for block in self.history.blocks:
            x = block(x, offsets)
        return torch.cat([tower(x) for tower in self.towers.values()], dim=-1)


def tiny_inputs():
    generator = torch.Generator().manual_seed(0)
    offsets = torch.tensor([0, 5, 45, 48])
    return torch.randn(48, DIM, generator=generator), offsets


def recipe_from_text(tmp_path: Path, text: str) -> Recipe:
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return load_recipe(path)


MX_POLICY = """
name = "test"
default = "mx"
[policies.mx]
all = "e4m3"
scale_mode = "rceil"
[policies.hp]
all = "bf16"
"""


def test_every_issue_recipe_is_shipped_and_loads():
    assert set(SHIPPED) <= set(available_recipes())
    for name in SHIPPED:
        recipe = load_recipe(name)
        assert recipe.name == name
        assert load_recipe(RECIPE_DIR / f"{name}.toml").name == name


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_recipe_applies_to_a_small_model_and_trains_a_step(name):
    torch.manual_seed(0)
    model = TinyGem()
    plan = apply_recipe(model, load_recipe(name), seed=1)
    json.dumps(plan.to_dict())
    assert "history.blocks.0.attn.qkv" in plan.table()
    x, offsets = tiny_inputs()
    out = model(x, offsets)
    out.square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    if name == "bf16":
        assert plan.quantized_modules == []
        assert not any(isinstance(m, QLinear) for m in model.modules())
    else:
        assert "history.blocks.1.mlp.0" in plan.quantized_modules
        for module in model.modules():  # the attention products went through qmatmul
            if isinstance(module, JaggedAttention):
                assert module.policy.qk.calls >= 1 and module.policy.pv.calls >= 1
            if isinstance(module, QLinear) and module.precision is not None:
                assert module.precision.calls == 1


def test_apply_recipe_hits_exactly_the_expected_modules():
    model = TinyGem()
    plan = apply_recipe(model, load_recipe("mxfp8-tail-bf16"))
    towers = {f"towers.{t}.{layer}" for t in ("ctr", "cvr") for layer in ("hidden", "out")}
    assert set(plan.high_precision_modules) == towers
    assert set(plan.quantized_modules) == set(quantizable_modules(model)) - towers
    for name, module in model.named_modules():
        if name in towers:
            assert type(module) is nn.Linear
        elif name.endswith(("qkv", "proj", "mlp.0", "mlp.2")):
            assert isinstance(module, QLinear) and module.precision.name == name
            assert module.precision.fwd.b.scale_mode == "rceil"
        elif name.endswith("core"):
            assert isinstance(module.policy, AttentionPolicy)
            assert isinstance(module.policy.qk, MatmulPrecision) and module.policy.pv.fwd.a.fmt == "e4m3"
    assert plan.padded_modules == {}  # only the high-precision towers have odd widths here


def test_first_matching_rule_wins_and_padding_is_recorded(tmp_path):
    recipe = recipe_from_text(
        tmp_path,
        MX_POLICY
        + """
[[rules]]
match = "towers.ctr.*"
policy = "mx"
[[rules]]
match = "towers.*"
policy = "hp"
""",
    )
    plan = apply_recipe(TinyGem(), recipe)
    entries = {entry.module: entry for entry in plan.entries}
    assert entries["towers.ctr.out"].quantized and entries["towers.ctr.out"].rule == "towers.ctr.*"
    assert not entries["towers.cvr.out"].quantized and entries["towers.cvr.out"].rule == "towers.*"
    assert entries["history.blocks.0.mlp.0"].rule == "default"
    assert plan.padded_modules == {
        "towers.ctr.hidden": ["out_features 20->32"],
        "towers.ctr.out": ["in_features 20->32", "out_features 1->32"],
    }
    assert "padded" in plan.table()
    # no [attention] table: attention stays high precision
    assert all(m.policy is None for m in TinyGem().modules() if isinstance(m, JaggedAttention))


def test_a_rule_matching_nothing_is_an_error_listing_the_names(tmp_path):
    recipe = recipe_from_text(tmp_path, MX_POLICY + '[[rules]]\nmatch = "tower.*.out"\npolicy = "hp"\n')
    with pytest.raises(ValueError, match=r"'tower\.\*\.out' matches no module.*towers\.ctr\.out"):
        apply_recipe(TinyGem(), recipe)
    with pytest.raises(ValueError, match="matches no module"):
        apply_recipe(nn.Sequential(nn.Linear(4, 4)), load_recipe("mxfp8-tail-bf16"))


@pytest.mark.parametrize(
    "text, message",
    [
        (MX_POLICY + '[[rules]]\nmatch = "towers.*"\npolicy = "fp7"\n', r"unknown policy 'fp7'; policies: mx, hp"),
        (MX_POLICY.replace('default = "mx"', 'default = "mxx"'), r"unknown policy 'mxx'"),
        (MX_POLICY.replace('all = "e4m3"', 'all = "e4m4"'), r"unknown format 'e4m4'; accepted: e4m3"),
        (
            MX_POLICY.replace('scale_mode = "rceil"', 'scale_mode = "round"'),
            r"unknown scale_mode 'round'; accepted: floor",
        ),
        (MX_POLICY + "fwdd = 'e4m3'\n", r"\[policies.hp\]: unknown key\(s\) 'fwdd'; accepted: all, fwd"),
        (MX_POLICY + "[policies.x]\nfwd = 'e4m3'\n", r"precision of dgrad is not given"),
        (
            MX_POLICY + "[policies.x]\nall = 'e4m3'\nfwd = {input = 'e4m3', grad_output = 'e4m3'}\n",
            r"unknown key\(s\) 'grad_output'",
        ),
        (
            MX_POLICY + "[policies.x]\nall = 'e4m3'\nrounding = {fwd = 'stochastic', bwd = 'x'}\n",
            r"'bwd'.*accepted: fwd, grad",
        ),
        (MX_POLICY + "[attention]\nqk = 'e4m3'\n", r"pv is not given"),
        (MX_POLICY + "[loss_scaling]\npolicy = 'adaptive'\n", r"unknown loss_scaling policy 'adaptive'"),
        (
            'name = "x"\ndefault = "a"\n[policies.a]\nall = "e4m3"\nblock = 16\n',
            r"unknown block 16; accepted: 32 or \[32, 32\]",
        ),
        ('name = "x"\ndefault = "a"\nextra = 1\n[policies.a]\nall = "e4m3"\n', r"unknown key\(s\) 'extra'"),
    ],
)
def test_invalid_recipes_fail_with_a_message_naming_the_problem(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        recipe_from_text(tmp_path, text)


def test_malformed_toml_and_unknown_names_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="malformed TOML"):
        recipe_from_text(tmp_path, 'name = "x"\n[policies.a\n')
    with pytest.raises(ValueError, match=r"no recipe 'mxfp9'.*available recipes: .*mxfp8-rceil"):
        load_recipe("mxfp9")


def test_state_dict_round_trips_between_plain_and_quantized_model():
    torch.manual_seed(0)
    plain = TinyGem()
    quantized = TinyGem()
    apply_recipe(quantized, load_recipe("mxfp8-rceil"))
    assert list(plain.state_dict()) == list(quantized.state_dict())
    quantized.load_state_dict(plain.state_dict())
    back = TinyGem()
    back.load_state_dict(quantized.state_dict())
    for (name, a), (_, b) in zip(plain.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), name


def test_reapplying_a_high_precision_recipe_restores_plain_numerics():
    torch.manual_seed(0)
    model = TinyGem()
    x, offsets = tiny_inputs()
    reference = model(x, offsets)
    apply_recipe(model, load_recipe("mxfp8-floor"))
    assert not torch.equal(model(x, offsets), reference)
    apply_recipe(model, load_recipe("bf16"))
    assert torch.equal(model(x, offsets), reference)


def test_single_layer_recipes_for_the_layer_sweep():
    model = TinyGem()
    recipe = load_recipe("mxfp8-rceil")
    names = quantizable_modules(model, recipe)
    assert "history.blocks.0.attn.core" in names and names[0] == "history.blocks.0.attn.qkv"
    assert "history.blocks.0.attn.core" not in quantizable_modules(model, load_recipe("bf16"))
    for module in ("history.blocks.1.mlp.2", "history.blocks.0.attn.core"):
        only = apply_recipe(TinyGem(), single_layer_recipe(recipe, module))
        assert only.quantized_modules == [module]
        all_but = apply_recipe(TinyGem(), single_layer_recipe(recipe, module, invert=True))
        assert all_but.high_precision_modules == [module]
        assert set(all_but.quantized_modules) == set(names) - {module}
    only_attention = TinyGem()
    apply_recipe(only_attention, single_layer_recipe(load_recipe("mxfp8-rceil-sr"), "history.blocks.0.attn.core"))
    policy = only_attention.history.blocks[0].attn.core.policy
    assert policy.qk.fwd.a.scale_mode == "rceil" and policy.pv.grad_a.a.rounding == "stochastic"  # inherited, kept
    with pytest.raises(ValueError, match="matches no module"):
        apply_recipe(TinyGem(), single_layer_recipe(recipe, "history.blocks.9.mlp.0"))
    with pytest.raises(ValueError, match="nothing to sweep"):
        single_layer_recipe(load_recipe("bf16"), "towers.ctr.out")


def test_recipe_round_trips_through_its_dict_and_plan_is_json():
    recipe = load_recipe("mxfp8-square32")
    again = parse_recipe(json.loads(json.dumps(recipe.to_dict())))
    assert again.policies == recipe.policies and again.attention == recipe.attention
    assert recipe.policies["mx"].fwd.b.block == (32, 32) and recipe.policies["mx"].fwd.a.block == 32
    plan = apply_recipe(TinyGem(), recipe)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["recipe"] == "mxfp8-square32" and "32x32" in data["modules"][0]["gemms"]["fwd"]


def test_stochastic_rounding_is_reproducible_per_run_seed_and_resumable():
    x, offsets = tiny_inputs()

    def gradients(seed, steps, state=None):
        torch.manual_seed(0)
        model = TinyGem(layers=1)
        apply_recipe(model, load_recipe("mxfp8-rceil-sr"), seed=seed)
        if state is not None:
            load_rounding_state(model, state)
        for _ in range(steps):
            model.zero_grad()
            model(x, offsets).square().mean().backward()
        return model.history.blocks[0].attn.qkv.weight.grad.clone(), rounding_state(model)

    first, state_after_one = gradients(seed=1, steps=1)
    second, _ = gradients(seed=1, steps=2)
    resumed, _ = gradients(seed=1, steps=1, state=state_after_one)
    assert torch.equal(first, gradients(seed=1, steps=1)[0])
    assert not torch.equal(first, gradients(seed=2, steps=1)[0])
    assert torch.equal(second, resumed)
    assert state_after_one["history.blocks.0.attn.qkv"] == 1


def test_describe_recipe_lists_policies_rules_and_attention():
    text = describe_recipe(load_recipe("mxfp8-tail-bf16"))
    assert "policy mx (default):" in text and "policy hp: high precision" in text
    assert "rule   'towers.*' -> hp" in text and "attention qk: fwd e4m3 b32 rceil" in text
    assert "high precision (no [attention] table)" in describe_recipe(load_recipe("bf16"))


def test_backends_are_converters_run_te_first_and_swaps_go_through_replace_module():
    from mxlab.recipe.apply import converters_for
    from mxlab.recipe.backends import Target
    from mxlab.recipe.backends.mxlab import MXLabConverter
    from mxlab.recipe.plan import replace_module

    recipe = load_recipe("mxfp8-rceil")
    assert list(converters_for(recipe)) == ["te", "mxlab"]  # mxlab, which refuses nothing, runs last
    model = TinyGem()
    target = Target("towers.ctr.out", model.towers.ctr.out, "linear", recipe.policies[recipe.default], "default")
    (entry,) = MXLabConverter(recipe.attention).convert(model, [target], seed=3)
    assert entry.module == "towers.ctr.out" and entry.quantized and isinstance(model.towers.ctr.out, QLinear)
    with pytest.raises(ValueError, match="not \\['x'\\]"):
        MXLabConverter().convert(model, [Target("x", nn.ReLU(), "relu", None, "default")])
    with pytest.raises(ValueError, match="not a submodule"):
        replace_module(model, "towers.nope", nn.Identity())


def test_a_quantizing_recipe_turns_on_inductors_exact_casts_and_the_plan_says_so():
    """Inductor keeps a bfloat16 model's eager bits only with emulate_precision_casts (tests/nn/test_compile.py):
    apply_recipe turns it on for a recipe that quantizes and names it in the plan; a BF16 recipe leaves it."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch({"emulate_precision_casts": False, "cpp.max_horizontal_fusion_size": 16}):
        plan = apply_recipe(nn.Sequential(nn.Linear(64, 32)), load_recipe("bf16"))
        assert not inductor_config.emulate_precision_casts and "emulate_precision_casts" not in plan.table()
        assert inductor_config.cpp.max_horizontal_fusion_size == 16
        plan = apply_recipe(nn.Sequential(nn.Linear(64, 32)), load_recipe("mxfp8-rceil"))
        assert inductor_config.emulate_precision_casts and inductor_config.cpp.max_horizontal_fusion_size == 1
        assert "Inductor's emulate_precision_casts turned on" in plan.table()
        assert "cpp.max_horizontal_fusion_size = 1" in plan.table()
        assert plan.to_dict()["inductor_emulate_precision_casts"] is True


def test_applying_a_recipe_imports_neither_inductor_nor_fsdp_and_still_sets_exact_casts():
    """apply_recipe in a process without Inductor or FSDP (the driver of `mxlab run`, whose preflight applies every
    recipe) imports neither; Inductor's emulate_precision_casts is on once its config is imported."""
    import subprocess
    import sys

    probe = (
        "import sys, torch\nfrom torch import nn\nfrom mxlab.recipe import apply_recipe\n"
        "apply_recipe(nn.Sequential(nn.Linear(64, 64)), 'mxfp8-rceil')\n"
        "heavy = ('torch._dynamo', 'torch._inductor', 'torch.distributed.fsdp', 'torch.distributed.tensor')\n"
        "print(sorted(name for name in heavy if name in sys.modules))\n"
        "import torch._inductor.config as config\n"
        "print(config.emulate_precision_casts, config.cpp.max_horizontal_fusion_size)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]", "True", "1"]
