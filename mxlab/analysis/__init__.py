"""Analysis of a study folder: loading (study), statistics (stats), the per-endpoint rule (verdicts),
the candidates' decision (decision), what a study can decide (sensitivity), simulation of the rule
(power), the paired deltas (compare) and the whole analysis (conclude)."""

from mxlab.analysis.compare import ArmResult, Comparison, Detectable, Preregistration, StudyAnalysis, inputs_from_runs
from mxlab.analysis.conclude import analyze_study, conclude
from mxlab.analysis.decision import DECISIONS, CandidateDecision, decide_candidates
from mxlab.analysis.power import (
    DecisionRates,
    NoiseModel,
    SeedsNeeded,
    SimulationResult,
    fit_noise_model,
    seeds_to_ship,
    simulate,
    simulate_decision,
)
from mxlab.analysis.stats import (
    OUTLIER_FALSE_ALARM,
    DeLongResult,
    Estimate,
    RunSums,
    SeedDeltas,
    delong_covariance,
    delong_test,
    detectable_effect,
    estimate,
    eval_variances,
    outlier_threshold,
    outlying_values,
    paired_delta,
)
from mxlab.analysis.study import RunStatus, StudyData, StudyInputs, inputs_from_summary, load_study
from mxlab.analysis.verdicts import VERDICTS, Hypothesis, Verdict, decide, holm_levels
from mxlab.experiment.report_settings import ReportSettings

__all__ = [
    "OUTLIER_FALSE_ALARM",
    "ArmResult",
    "CandidateDecision",
    "DECISIONS",
    "Preregistration",
    "decide_candidates",
    "Comparison",
    "DeLongResult",
    "DecisionRates",
    "Detectable",
    "Estimate",
    "Hypothesis",
    "NoiseModel",
    "ReportSettings",
    "RunStatus",
    "RunSums",
    "SeedDeltas",
    "SeedsNeeded",
    "SimulationResult",
    "StudyAnalysis",
    "StudyData",
    "StudyInputs",
    "VERDICTS",
    "Verdict",
    "analyze_study",
    "conclude",
    "decide",
    "delong_covariance",
    "delong_test",
    "detectable_effect",
    "estimate",
    "eval_variances",
    "fit_noise_model",
    "holm_levels",
    "inputs_from_runs",
    "inputs_from_summary",
    "load_study",
    "outlier_threshold",
    "outlying_values",
    "paired_delta",
    "seeds_to_ship",
    "simulate",
    "simulate_decision",
    "worse_when",
]
