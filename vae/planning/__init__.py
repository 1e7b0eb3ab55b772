"""Planning a pass before it runs: what runs (untiled, temporal slices, exact or fast tiles, frame stages, host
memory), its predicted peak (the pass on meta tensors: `meta_pass`), its expected time; and running exactly that
plan."""

from .execute import run_plan
from .plan import PassPlan
from .predict import predict_plan
from .search import PlanRequest, fastest_fitting_plan

__all__ = ["PassPlan", "PlanRequest", "fastest_fitting_plan", "predict_plan", "run_plan"]
