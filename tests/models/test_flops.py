import pytest
import torch
from torch import nn

from mxlab.data import DataInfo, JaggedBatch
from mxlab.models import build_model
from mxlab.models.flops import model_flops
from mxlab.nn.attention import JaggedAttention

CONFIG = dict(
    size="tiny",
    dim=4,
    heads=2,
    layers=1,
    mlp_ratio=2,
    pma_seeds=1,
    cross_layers=1,
    cross_rank=2,
    interaction_dim=8,
    tower_dims=(3,),
)
INFO = DataInfo(
    n_dense=1, field_cardinalities=(5, 7), n_items=6, n_actions=3, has_truth=False, name="hand", candidate_field=0
)
LENGTHS = [0, 2, 3]  # B = 3, N = 5 history tokens, sum L^2 = 13; 3 tokens per example (2 fields + dense)


def test_flops_of_a_small_case_match_a_hand_count():
    flops = model_flops(CONFIG, INFO, LENGTHS)
    hand = {
        "dense_proj": 2 * 3 * 1 * 4,  # 24
        "history": 2 * 5 * 4 * 12 + 2 * 5 * 4 * 4 + 2 * (2 * 5 * 4 * 8),  # qkv, out, fc1, fc2 = 1280
        "history.attention": 4 * 4 * 13,  # (QK^T + PV) 2 * head_dim * heads per pair: 208
        "pma": 2 * 3 * 16 + 2 * 5 * 4 * 8 + 2 * 3 * 16,  # q (B x 1 seed), kv (N), out = 512
        "pma.attention": 4 * 4 * 1 * 5,  # 1 seed x 5 keys: 80
        "cross": 2 * 9 * 16 + 2 * 5 * 4 * 8 + 2 * 9 * 16,  # q (B x 3 tokens), kv, out = 896
        "cross.attention": 4 * 4 * 3 * 5,  # 240
        "interaction": 2 * 3 * 28 * 8 + 2 * 3 * 8 * 2 + 2 * 3 * 2 * 8,  # input (7 tokens x 4), down, up = 1536
        "towers": 2 * (2 * 3 * 8 * 3 + 2 * 3 * 3 * 1),  # two towers: fc0, out = 324
    }
    assert flops.parts == pytest.approx(hand)
    assert flops.forward == 5100 and flops.attention == 528 and flops.train_step == 3 * 5100
    causal = model_flops({**CONFIG, "causal": True}, INFO, LENGTHS)
    assert causal.parts["history.attention"] == 4 * 4 * (0 + 3 + 6)  # L (L + 1) / 2 pairs
    with pytest.raises(ValueError, match="history_lengths"):
        model_flops(CONFIG, INFO, [1, -1])


@pytest.mark.parametrize("length_token", [False, True])
def test_flops_match_the_gemms_and_attention_pairs_the_model_runs(length_token):
    """Count every nn.Linear call (2 M K N) and every attention call's pairs in a real forward (with the history
    length's token: one more query of the token cross-attention, a wider interaction input)."""
    torch.manual_seed(0)
    config = {**CONFIG, "history_length_token": length_token}
    model = build_model(config, INFO).eval()
    counted = {"gemm": 0.0, "attention": 0.0}

    def linear_hook(module, args, output):
        counted["gemm"] += (
            2.0 * args[0].reshape(-1, module.in_features).shape[0] * module.in_features * module.out_features
        )

    def attention_hook(module, args, output):
        q, k, _, q_offsets, k_offsets = args
        pairs = ((q_offsets[1:] - q_offsets[:-1]) * (k_offsets[1:] - k_offsets[:-1])).sum().item()
        counted["attention"] += 4.0 * q.shape[1] * q.shape[2] * pairs

    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.register_forward_hook(linear_hook)
        if isinstance(module, JaggedAttention):
            module.register_forward_hook(attention_hook)
    total = sum(LENGTHS)
    batch = JaggedBatch(
        dense=torch.randn(3, 1),
        sparse=torch.tensor([[1, 2], [0, 6], [4, 0]]),
        history_items=torch.randint(0, 6, (total,)),
        history_actions=torch.randint(0, 3, (total,)),
        history_offsets=torch.tensor([0, 0, 2, 5]),
        click=torch.zeros(3),
        conversion=torch.zeros(3),
        user_id=torch.arange(3),
    )
    with torch.no_grad():
        model(batch)
    flops = model_flops(config, INFO, LENGTHS)
    assert counted["gemm"] == flops.gemm and counted["attention"] == flops.attention
    assert (flops.gemm > model_flops(CONFIG, INFO, LENGTHS).gemm) == length_token
