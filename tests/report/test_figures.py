import numpy as np

from mxlab.report import figures

ARMS = [f"arm-{i}" for i in range(10)]  # ten arms: a legend as long as gem-mxfp8's


def _logs(arms, steps, scale=lambda arm, step: 1.0):
    return {
        arm: {
            seed: [{"step": s, "loss": 0.5 - 0.01 * s + 0.001 * n, "loss_scale": scale(arm, s)} for s in steps]
            for seed in (0, 1)
        }
        for n, arm in enumerate(arms)
    }


def _legends_inside(figure):
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    legends = list(figure.legends) + [ax.get_legend() for ax in figure.axes if ax.get_legend() is not None]
    assert legends, "the figure has no legend"
    box = figure.bbox
    for legend in legends:
        extent = legend.get_window_extent(renderer)
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0 and extent.y1 <= box.y1, (
            extent,
            box,
        )


def _integer_ticks(ax):
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks


def test_training_curves_show_the_warm_up_tick_integer_steps_and_keep_the_legend_inside(tmp_path):
    logs = _logs(ARMS, steps=[65, 66, 67, 68])  # four continued steps: a default axis would tick at 65.5
    logs["_fork"] = {
        seed: [{"step": s, "loss": 0.9 - 0.005 * s, "loss_scale": 1.0} for s in range(2, 65, 2)] for seed in (0, 1)
    }
    figure = figures.training_curves(tmp_path / "t.png", logs, ARMS, {})
    assert (tmp_path / "t.png").stat().st_size > 1000
    assert len(figure.axes) == 1  # every loss scale is 1: the flat panel is named, not drawn
    assert "loss scale 1 in every run" in figure.axes[0].get_title()
    _integer_ticks(figure.axes[0])
    _legends_inside(figure)
    labels = [t.get_text() for t in figure.legends[0].get_texts()]
    assert labels[0] == "fork warm-up" and labels[1:] == ARMS
    only_arms = figures.training_curves(tmp_path / "u.png", _logs(ARMS[:2], [1, 2, 3]), ARMS[:2], {})
    _integer_ticks(only_arms.axes[0])


def test_a_loss_scale_that_moves_gets_its_panel(tmp_path):
    logs = _logs(ARMS[:3], steps=list(range(0, 40, 5)), scale=lambda arm, step: 2.0 ** (16 - step // 10))
    figure = figures.training_curves(tmp_path / "t.png", logs, ARMS[:3], {})
    assert len(figure.axes) == 2 and figure.axes[1].get_yscale() == "log"
    _legends_inside(figure)


def test_heldout_and_reliability_legends_lie_inside_the_image(tmp_path):
    series = {
        arm: {seed: [(s, {"ctr.ne": 0.9 - 0.001 * s, "ctcvr.ne": 0.8}) for s in (10, 20, 30)] for seed in (0, 1)}
        for arm in ["_fork", *ARMS]
    }
    heldout = figures.heldout_curves(tmp_path / "h.png", series, ARMS)
    for ax in heldout.axes:
        _integer_ticks(ax)
    _legends_inside(heldout)
    rng = np.random.default_rng(0)
    curves = {}
    from mxlab import metrics

    for task in metrics.TASKS:
        curves[task] = {}
        for arm in ARMS:
            p = rng.uniform(0.01, 0.5, 2000)
            curves[task][arm] = metrics.reliability_bins((rng.uniform(size=2000) < p).astype(float), p, 10)
    _legends_inside(figures.reliability_diagram(tmp_path / "r.png", curves, ARMS))


def test_a_numerics_quantity_the_same_in_every_cell_is_named_not_drawn(tmp_path):
    records = {
        arm: [
            {"module": f"m{i}", "gemm": "fwd", "sqnr_db": 30.0 + i + a, "saturated_frac": 0.0, "flushed_frac": 1e-3 * i}
            | {"subnormal_frac": 0.0}
            for i in range(3)
        ]
        for a, arm in enumerate(ARMS[:2])
    }
    figure = figures.numerics_heatmap(tmp_path / "n.png", records)
    titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
    assert titles == ["SQNR (dB, higher is better)", "flushed to zero (% of elements)"]
    assert "saturated (% of elements): 0" in figure.get_suptitle() and "subnormal" in figure.get_suptitle()
    assert figures.is_flat([[1.0, np.nan, 1.0]]) and not figures.is_flat([[1.0], [2.0]])


def test_heldout_panels_follow_the_declared_heads(tmp_path):
    """Independent heads: one panel per head's held-out NE, in the records' order (no empty CTR panel)."""
    series = {arm: {0: [(s, {"like.ne": 0.5, "share.ne": 0.4, "like.auc": 0.7}) for s in (8, 16)]} for arm in ARMS}
    figure = figures.heldout_curves(tmp_path / "h.png", series, ARMS)
    assert [ax.get_title().split()[1] for ax in figure.axes] == ["like.ne", "share.ne"]
