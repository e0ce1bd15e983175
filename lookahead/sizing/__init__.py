"""Cost-aware draft sizing (numpy and numba only): how many drafted tokens are worth verifying.

- the keep chance (per request, the chance that a drafted token is kept, per anchor match length) is
  learnt by the engine's kernels (lookahead.engine.kernels.learn_row, keep_chance);
- `cost`: what a verify step over `rows` x `width` tokens costs, behind one interface
  `cost(rows, width)` (relative to a plain one-row step) and `fixed_cost_tokens` (F / p):
  the measured curve for one row (`StepCosts`), the fitted line for many (`StepCostFit`);
- `rules`: the sizes those two imply, for one row (`chain_size`, `tree_nodes`), a static
  batch (`static_batch_draft_sizes`) and a served batch (`batch_draft_sizes`, over its kernel `batch_sizes`);
- `load`: a served batch's load rule: the step cost learnt from its step times (`DraftStepCost`),
  whether drafts pay at a load (`worth_sending`), the sizer's trust per load (`KeptShare`).
"""
