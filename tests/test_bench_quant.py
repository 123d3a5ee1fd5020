"""`mxlab bench quant`'s summary against its bandwidth targets (CPU: fabricated measurements)."""
from mxlab.bench.quant import TARGETS, Measurement, target_summary


def measurement(rows: int, cols: int, op: str, ratio: float) -> Measurement:
    return Measurement(rows, cols, op, 1.0, 1, 1.0, ratio)


def test_target_summary_reads_the_headline_size_and_its_probes():
    measurements = [
        measurement(64, 64, "row cast", 0.99),  # another size: ignored
        measurement(128, 64, "row cast", 0.80),
        measurement(128, 64, "probe row cast", 0.82),
        measurement(128, 64, "column cast", 0.75),
    ]
    summary = {entry["op"]: entry for entry in target_summary(measurements, 128, 64)}
    assert set(summary) == {"row cast", "column cast"}  # untimed targets are left out
    assert summary["row cast"] == dict(op="row cast", target=TARGETS["row cast"][0], ratio=0.80, probe=0.82,
                                       met=False)
    assert summary["column cast"]["met"] is True and summary["column cast"]["probe"] is None  # 0.75 >= 0.75
