"""The drafting engine every loop drives (numpy and numba only): per-request state in arrays owned by one
object, and the kernels over it (docs/design.md, "The engine, and who drives it").

- `kernels`: the state's layout, the keep rate and plans (learn_row, plan_row), a batched step (advance);
- `chain`: a draft's lookup candidates and its chain (draft_chain), the kernel LookupDrafter and advance both call;
- `groups`: the kernels' arguments as tuples, a constant per field and a builder per group;
- `slots.Slots`: the state's owner; `arena.IndexArena`: many token indexes in three arrays;
- `documents.DocumentStores`: the documents stores live requests consult; `between_steps.BetweenSteps`: a step's thread;
- `batch.Batch`: many requests at once, by the caller's keys (the vLLM proposer's); `lookahead.request.Request` drives one slot.
"""
