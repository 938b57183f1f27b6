"""dcp bench runtime's hand-made plans train every sample at most once an epoch (the runtime refuses a repeat)."""

from dcp.bench.runtime import fixed_step_plan


def test_plans_of_an_epoch_never_repeat_a_sample():
    steps, ga, b = 10, 3, 2
    seen: list[int] = []
    for s in range(steps):
        sizes = (2,) if s % 2 else (1, 1)  # the bench's "switch" pattern: one or two groups a step
        plan = fixed_step_plan(0, s, sizes, ga, 256, 2, b)
        seen += [i for g in plan.groups for mb in g.micro_batches for i in mb.sample_ids]
    assert len(seen) == len(set(seen))
    assert max(seen) < 2 * steps * ga * b  # within the bench's dataset
