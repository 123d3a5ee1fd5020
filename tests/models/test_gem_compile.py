"""The GEM model under torch.compile (default settings, backend "aot_eager"): batches of new history lengths compile
no new frames once the token axis is dynamic, a deeper model compiles no more frames than a shallow one, and the
compiled forward keeps eager mode's bits. (Its gradients are not compared: those of the non-sequence tokens, which
three paths use, sum in another order in AOTAutograd's backward graph than in eager mode's autograd engine.)"""

import pytest
import torch

from mxlab.data import make_source
from mxlab.models import build_model, esmm_loss
from mxlab.recipe import apply_recipe


@pytest.fixture(scope="module")
def batches():
    source = make_source({"source": "synthetic", "train_examples": 192, "eval_examples": 64, "n_users": 50}, 48)
    taken = [batch for _, batch in zip(range(4), source.train_batches(48, 0, 0))]
    widths = [sorted(set(batch.history_lengths().tolist())) for batch in taken]
    assert len({int(batch.history_offsets[-1]) for batch in taken}) == 4 and len({str(w) for w in widths}) == 4
    return source.info, taken


def _model(info, layers: int):
    torch.manual_seed(0)
    model = build_model({"size": "tiny", "layers": layers, "max_history": 48}, info).train()
    apply_recipe(model, "bf16", seed=0)
    return model


def _step(model, batch) -> list[torch.Tensor]:
    output = model(batch)
    esmm_loss(output, batch)["loss"].backward()  # the backward graphs compile too
    model.zero_grad(set_to_none=True)
    return [output.ctr_logit.detach(), output.cvr_logit.detach()]


def _frames_per_batch(info, batches, layers: int) -> list[int]:
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    eager, model = _model(info, layers), _model(info, layers)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter)
    frames = []
    with torch._dynamo.config.patch(recompile_limit=64):
        for index, batch in enumerate(batches):
            for want, got in zip(_step(eager, batch), _step(compiled, batch), strict=True):
                assert torch.equal(want, got), f"batch {index}: the compiled step differs from eager mode"
            frames.append(counter.frame_count)
    return frames


@pytest.mark.slow  # about 40 s on one core: `make test-all`
def test_batches_of_new_history_lengths_and_more_layers_compile_no_new_frames(batches):
    info, taken = batches
    shallow = _frames_per_batch(info, taken, layers=1)
    deep = _frames_per_batch(info, taken, layers=2)
    # the first batch compiles every frame, the second the frames whose token axis became dynamic; then none
    assert shallow[1] == shallow[2] == shallow[3], shallow
    assert deep == shallow, (deep, shallow)
