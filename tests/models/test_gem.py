import pytest
import torch
from torch import nn

from mxlab.data import DataInfo, JaggedBatch, make_source
from mxlab.data.synthetic import rank_auc
from mxlab.models import MODEL_CONFIG_KEYS, PRESETS, ModelOutput, build_model, esmm_loss, validate_model_config
from mxlab.nn.attention import JaggedAttention


@pytest.fixture(scope="module")
def source():
    return make_source(
        {"source": "synthetic", "train_examples": 3072, "eval_examples": 2048, "n_users": 300, "base_ctr": 0.2}, 64
    )


def _model(info, seed=0, **overrides):
    torch.manual_seed(seed)
    return build_model({"size": "tiny", **overrides}, info).eval()


def test_shapes_dtypes_and_loss(source):
    batch = next(source.eval_batches(64))
    output = _model(source.info)(batch)
    assert isinstance(output, ModelOutput)
    assert output.ctr_logit.shape == (64,) and output.cvr_logit.shape == (64,)
    assert output.ctr_logit.dtype == torch.float32 and torch.isfinite(output.cvr_logit).all()
    losses = esmm_loss(output, batch)
    assert set(losses) == {"loss", "ctr", "ctcvr"} and all(
        v.dtype == torch.float32 and v.dim() == 0 for v in losses.values()
    )
    # the ESMM terms against a direct float64 computation
    p_ctr = torch.sigmoid(output.ctr_logit.double())
    p_ctcvr = p_ctr * torch.sigmoid(output.cvr_logit.double())
    y, z = batch.click.double(), (batch.click * batch.conversion).double()
    bce = lambda p, t: -(t * p.log() + (1 - t) * (1 - p).log()).mean()
    assert losses["ctr"].item() == pytest.approx(bce(p_ctr, y).item(), rel=1e-5)
    assert losses["ctcvr"].item() == pytest.approx(bce(p_ctcvr, z).item(), rel=1e-5)
    assert losses["loss"].item() == pytest.approx(losses["ctr"].item() + losses["ctcvr"].item(), rel=1e-6)
    batch.has_conversion = False
    assert esmm_loss(output, batch)["loss"].item() == pytest.approx(losses["ctr"].item(), rel=1e-6)


@pytest.mark.parametrize("activation,causal", [("softmax", False), ("silu", True)])
def test_no_leakage_between_examples_or_from_padding(source, activation, causal):
    batch = next(source.eval_batches(16))
    model = _model(source.info, activation=activation, causal=causal)
    with torch.no_grad():
        base = model(batch)
        # give example 3 a different and much longer history; nobody else may notice
        lengths = batch.history_lengths().tolist()
        items = [batch.history_items[batch.history_offsets[i] : batch.history_offsets[i + 1]] for i in range(16)]
        items[3] = torch.randint(0, source.info.n_items, (64,))
        lengths[3] = 64
        offsets = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
        changed = JaggedBatch(
            **{
                **batch.__dict__,
                "history_items": torch.cat(items),
                "history_actions": torch.zeros(int(offsets[-1]), dtype=torch.int64),
                "history_offsets": offsets,
            }
        )
        changed.history_actions = torch.cat(
            [
                batch.history_actions[batch.history_offsets[i] : batch.history_offsets[i + 1]]
                if i != 3
                else torch.zeros(64, dtype=torch.int64)
                for i in range(16)
            ]
        )
        after = model(changed)
        others = torch.arange(16) != 3
        torch.testing.assert_close(after.ctr_logit[others], base.ctr_logit[others], rtol=0, atol=2e-5)
        torch.testing.assert_close(after.cvr_logit[others], base.cvr_logit[others], rtol=0, atol=2e-5)
        assert (after.ctr_logit[3] - base.ctr_logit[3]).abs() > 1e-4
        # one example alone (no padding around it) gives the same output as inside the batch
        for index in (0, 5):
            alone = model(batch.take(torch.tensor([index])))
            torch.testing.assert_close(alone.ctr_logit, base.ctr_logit[index : index + 1], rtol=0, atol=2e-5)


def test_gradients_reach_every_parameter(source):
    batch = next(source.train_batches(128, 0, 0))
    model = _model(source.info).train()
    esmm_loss(model(batch), batch)["loss"].backward()
    missing = [
        name
        for name, parameter in model.named_parameters()
        if parameter.grad is None or parameter.grad.abs().sum() == 0
    ]
    assert missing == []


def test_every_gemm_is_a_named_linear_or_jagged_attention(source):
    model = _model(source.info, layers=2)
    modules = dict(model.named_modules())
    for name in [
        "history.blocks.0.attn.qkv",
        "history.blocks.1.attn.out",
        "history.blocks.0.mlp.fc1",
        "history.blocks.1.mlp.fc2",
        "pma.attn.q",
        "pma.attn.kv",
        "pma.attn.out",
        "cross.attn.q",
        "cross.attn.kv",
        "cross.attn.out",
        "interaction.input",
        "interaction.layers.0.down",
        "interaction.layers.0.up",
        "towers.ctr.fc0",
        "towers.ctr.out",
        "towers.cvr.fc0",
        "towers.cvr.out",
        "dense_proj",
    ]:
        assert isinstance(modules[name], nn.Linear), name
    for name in ["history.blocks.0.attn.core", "pma.attn.core", "cross.attn.core"]:
        assert isinstance(modules[name], JaggedAttention) and modules[name].policy is None
    allowed = (nn.Linear, nn.Embedding, nn.LayerNorm, nn.RMSNorm)
    for name, module in modules.items():
        own = [p for p_name, p in module.named_parameters(recurse=False)]
        if own and not isinstance(module, allowed):
            assert name == "pma" and [n for n, _ in module.named_parameters(recurse=False)] == ["seeds"]


def test_same_seed_same_model_and_outputs(source):
    batch = next(source.eval_batches(32))
    first, second, other = _model(source.info, seed=7), _model(source.info, seed=7), _model(source.info, seed=8)
    assert torch.equal(first(batch).ctr_logit, second(batch).ctr_logit)
    assert not torch.equal(first(batch).ctr_logit, other(batch).ctr_logit)


def test_empty_histories_and_sources_without_candidate_or_dense():
    info = DataInfo(
        n_dense=0,
        field_cardinalities=(5, 7),
        n_items=1,
        n_actions=1,
        has_truth=False,
        name="criteo",
        candidate_field=None,
        has_conversion=False,
        has_history=False,
    )
    batch = JaggedBatch(
        dense=torch.zeros(4, 0),
        sparse=torch.tensor([[1, 2], [0, 6], [4, 0], [2, 2]]),
        history_items=torch.zeros(0, dtype=torch.int64),
        history_actions=torch.zeros(0, dtype=torch.int64),
        history_offsets=torch.zeros(5, dtype=torch.int64),
        click=torch.tensor([1.0, 0, 0, 1]),
        conversion=torch.zeros(4),
        user_id=torch.arange(4),
        has_conversion=False,
    )
    model = _model(info).train()
    output = model(batch)
    assert torch.isfinite(output.ctr_logit).all() and output.ctr_logit[0] != output.ctr_logit[1]
    esmm_loss(output, batch)["loss"].backward()
    assert model.embeddings.fields.weight.grad.abs().sum() > 0


def test_bf16_autocast_keeps_float32_logits(source):
    batch = next(source.eval_batches(16))
    model = _model(source.info)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = model(batch)
    assert output.ctr_logit.dtype == torch.float32 and torch.isfinite(output.ctr_logit).all()
    torch.testing.assert_close(output.ctr_logit, model(batch).ctr_logit, rtol=0, atol=0.15)


def test_tiny_model_learns_the_synthetic_signal(source):
    model = _model(source.info).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for batch in source.train_batches(256, seed=0, epoch=0):
        loss = esmm_loss(model(batch), batch)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        scores, labels = zip(*[(model(b).ctr_logit, b.click) for b in source.eval_batches(1024)])
    auc = rank_auc(torch.cat(labels).numpy(), torch.cat(scores).numpy())
    assert auc > 0.62


def test_config_validation_and_presets():
    assert validate_model_config({}).dim == PRESETS["tiny"]["dim"]
    big = validate_model_config({"size": "h200"})
    assert big.dim >= 128 and big.layers >= 2 and big.max_history == 1024
    assert validate_model_config({"size": "h200", "dim": 128, "tower_dims": [64]}).tower_dims == (64,)
    with pytest.raises(ValueError, match=r"unknown key 'model\.depth'; accepted keys in \[model\]:.*dim.*layers"):
        validate_model_config({"depth": 3})
    with pytest.raises(ValueError, match="multiple of heads"):
        validate_model_config({"dim": 30, "heads": 4})
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        validate_model_config({"size": "huge"})
    with pytest.raises(ValueError, match="activation 'relu'"):
        validate_model_config({"activation": "relu"})
    assert {
        "dim",
        "layers",
        "heads",
        "max_history",
        "activation",
        "rotary",
        "causal",
        "pma_seeds",
        "cross_layers",
        "tower_dims",
        "dropout",
        "size",
    } <= set(MODEL_CONFIG_KEYS)


def test_h200_preset_runs_long_histories():
    source = make_source({"source": "synthetic", "train_examples": 10, "eval_examples": 6, "n_users": 50}, 512)
    batch = next(source.eval_batches(6))
    assert int(batch.history_lengths().max()) > 128  # several attention tiles and buckets
    torch.manual_seed(0)
    model = build_model({"size": "h200"}, source.info).eval()
    assert sum(p.numel() for p in model.parameters()) > 5_000_000
    with torch.no_grad():
        output = model(batch)
    assert output.ctr_logit.shape == (6,) and torch.isfinite(output.ctr_logit).all()


def test_an_mx_recipe_reaches_every_attention_product_and_stays_close(source):
    from pathlib import Path

    import mxlab.recipe as recipe_module

    recipes = Path(__file__).resolve().parents[2] / "experiments" / "recipes"
    batch = next(source.train_batches(64, 0, 0))
    baseline = _model(source.info).train()
    quantized = _model(source.info).train()
    recipe_module.apply_recipe(quantized, recipe_module.load_recipe("mxfp8-floor", search_dirs=[recipes]))
    cores = [m for m in quantized.modules() if isinstance(m, JaggedAttention)]
    assert len(cores) == 3 and all(core.policy is not None for core in cores)
    expected, got = baseline(batch), quantized(batch)
    difference = (got.ctr_logit - expected.ctr_logit).abs().max().item()
    assert 0 < difference < 0.1 * expected.ctr_logit.abs().max().item()
    esmm_loss(got, batch)["loss"].backward()
    assert quantized.history.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_under_bf16_autocast_an_mx_model_runs_every_module_in_the_baselines_dtype(source):
    """An MX recipe changes the GEMMs only: each module's output has the dtype it has in the baseline."""
    from pathlib import Path

    import mxlab.recipe as recipe_module

    recipes = Path(__file__).resolve().parents[2] / "experiments" / "recipes"
    batch = next(source.train_batches(64, 0, 0))

    def output_dtypes(model):
        dtypes = {}
        hooks = [
            module.register_forward_hook(lambda _m, _a, out, name=name: dtypes.__setitem__(name, out.dtype))
            for name, module in model.named_modules()
            if name
        ]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(batch)
        for hook in hooks:
            hook.remove()
        return dtypes

    expected = output_dtypes(_model(source.info).train())
    quantized = _model(source.info).train()
    recipe_module.apply_recipe(quantized, recipe_module.load_recipe("mxfp8-rceil", search_dirs=[recipes]))
    got = output_dtypes(quantized)
    assert got == expected
    assert got["history.blocks.0.mlp.fc1"] == got["history.blocks.0.attn.qkv"] == torch.bfloat16


def test_esmm_loss_is_finite_with_finite_gradients_at_extreme_logits():
    logits = torch.tensor([30.0, -30.0, 0.0, 12.0, -80.0], requires_grad=True)
    cvr = torch.tensor([30.0, 20.0, -5.0, 40.0, -80.0], requires_grad=True)
    batch = JaggedBatch(
        dense=torch.zeros(5, 1),
        sparse=torch.zeros(5, 1, dtype=torch.int64),
        history_items=torch.zeros(0, dtype=torch.int64),
        history_actions=torch.zeros(0, dtype=torch.int64),
        history_offsets=torch.zeros(6, dtype=torch.int64),
        click=torch.tensor([0.0, 1, 1, 1, 0]),
        conversion=torch.tensor([0.0, 1, 0, 1, 0]),
        user_id=torch.arange(5),
    )
    losses = esmm_loss(ModelOutput(logits, cvr), batch)
    losses["loss"].backward()
    assert torch.isfinite(losses["loss"]) and torch.isfinite(logits.grad).all() and torch.isfinite(cvr.grad).all()
    # per example: -log(1 - p) with log p capped at -1e-12 (27.63 nats), -log p = 30.0, 0.00335, ~0, ~0
    assert losses["ctcvr"].item() * 5 == pytest.approx(27.631 + 30.0 + 0.00335, rel=1e-3)


def test_rms_norm_keeps_the_input_dtype_under_autocast_and_refuses_two_normalized_dims():
    from mxlab.nn.norms import RMSNorm

    norm = RMSNorm(16)
    x = torch.randn(5, 2, 16, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x)
    expected = torch.nn.functional.rms_norm(
        x.float(), (16,), norm.weight.bfloat16().float(), torch.finfo(torch.float32).eps
    )
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), expected, atol=0, rtol=2**-7)
    with pytest.raises(ValueError, match=r"normalizes the last dim only; got normalized_shape \(2, 16\)"):
        RMSNorm((2, 16))(x)


def test_history_item_fields_add_each_items_topic_from_the_candidates_topic_rows(source):
    info = source.info
    topics, n_topics = dict(info.item_fields)["ad_topic"], info.field_cardinalities[1]
    assert len(topics) == info.n_items and all(t == item % n_topics for item, t in enumerate(topics))
    plain, with_topic = _model(info), _model(info, history_item_fields=["ad_topic"])
    assert with_topic.state_dict().keys() == plain.state_dict().keys()  # no new parameter: the fields table's rows
    captured = {}
    for name, model in (("plain", plain), ("topic", with_topic)):
        model.history.register_forward_pre_hook(lambda module, args, name=name: captured.__setitem__(name, args[0]))
    batch = next(source.eval_batches(64))
    plain(batch), with_topic(batch)
    items = batch.history_items
    topic_field = list(info.field_names).index("ad_topic")  # its token's rows start after the fields before it
    offset = sum(info.field_cardinalities[f] for f in range(topic_field) if f != info.candidate_field)
    rows = with_topic.embeddings.fields.weight[offset + torch.tensor(topics)[items]]
    assert torch.equal(captured["topic"], (captured["plain"] + rows).to(captured["topic"].dtype))
    assert not torch.equal(plain(batch).ctr_logit, with_topic(batch).ctr_logit)


def test_history_item_fields_refuse_fields_the_source_does_not_state(source):
    with pytest.raises(
        ValueError, match=r"'user_segment' is not an item field of source 'synthetic'; accepted: ad_topic"
    ):
        _model(source.info, history_item_fields=["user_segment"])
    with pytest.raises(ValueError, match=r"history_item_fields: 'ad_topic' is not an item field of source 'bare'"):
        info = DataInfo(n_dense=0, field_cardinalities=(5,), n_items=5, n_actions=1, has_truth=False, name="bare")
        _model(info, history_item_fields=["ad_topic"])


def test_the_history_length_token_embeds_each_examples_length_bucket(source):
    import math

    from mxlab.models.side_features import history_length_boundaries

    boundaries = history_length_boundaries(128)
    octave_quarters = [math.floor(4 * math.log2(length + 1)) for length in range(129)]
    ranks = {value: rank for rank, value in enumerate(sorted(set(octave_quarters)))}
    buckets = torch.bucketize(torch.arange(129), boundaries, right=True) - 1
    assert buckets.tolist() == [ranks[value] for value in octave_quarters]  # floor(4 log2(L + 1)), ranked
    assert boundaries[0] == 0 and buckets[0] == 0 and buckets[1] == 1

    info = source.info
    plain, with_length = _model(info), _model(info, history_length_token=True)
    assert set(with_length.state_dict()) - set(plain.state_dict()) == {"length_token.embedding.weight"}
    batch = next(source.eval_batches(64))
    lengths = batch.history_offsets.diff()
    tokens = with_length.tokens(batch, torch.float32)
    assert tokens.shape[1] == plain.tokens(batch, torch.float32).shape[1] + 1
    rows = with_length.length_token.embedding.weight[
        torch.bucketize(lengths, boundaries[boundaries <= 64], right=True) - 1
    ]
    normed = with_length.token_norm(rows.to(torch.float32))
    assert torch.equal(tokens[:, -1], normed)  # the last token: the normed row of each example's bucket
    assert with_length(batch).ctr_logit.shape == plain(batch).ctr_logit.shape
