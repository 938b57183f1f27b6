"""The planner's tuned constants, in one place (30 here; the batch tail's own, ``step_tokens.TOKEN_TARGETS``,
``TOKEN_LAG``, ``MEAN_TOLERANCE``, ``GIVE_BACK`` and ``tail.TAIL_*``, sit beside their code, as do the constants
that only trade CPU time for the same plans: ``packing.DENSE_WINDOW``, ``sorting.SMALL``, ``balance._SCAN_MAX``).

Each trades plan quality (GPU-weighted idle of a step, what ``dcp simulate`` reports as idle) against planning
time (``dcp bench planner``) or step count. They were set by hand against the simulator's paper scenarios
(t1d-*/t2d-* distributions on the analytic H100/H200 tables, ``dcp simulate``) and the planner benchmark; the
figures quoted are the ones recorded in the commits and docs that introduced them (docs/planner.md,
docs/benchmarks.md). None of them changes which plans are valid, only which valid plan is chosen: the unit
tests check validity (every sample once, rank cover, Gmax) for any value, and ``scripts/plan_hash.py`` pins
the plans these values give.

What each pass earns, priced: ``dcp bench peers --methods dcp-intra --seeds 0,1,2,3`` (32 simulated H200, 30000
samples, the default batch, 7 datasets x 4 seeds = 28 cells), the pass switched off alone; the mean and the worst
loss of the ideal fraction over the 28 cells, in points: ``balance`` (with ``fill_ahead``) 5.80 / 29.6 (text seed
0); other targets (``step._other_targets``) 2.47 / 6.78, and 2 cells then hold a step outside the bounds;
sync-aware ends (``syncend``) 1.06 / 5.35; the dense window (``dense``) 0.30 / 2.39; the head in another group
(``step._try_head_elsewhere``) 0.12 / 1.75; ``fill_ahead`` alone 0.07 / 0.91; the last two steps planned
together (``tail``) 0.07 / 0.37, and without it a last step at 0.877 x the batch (t2d-balanced seed 1); the local
search's swaps (``improve``) 0.05 / 0.84, and without them a last step at 0.697 x (t2d-balanced seed 2). The
four passes skipped from BULK_MIN_RANKS together: 3.79 / 8.14, what a 32-rank world would lose without them.
A step that reached on past its tokens for the work beside a long sample (``_fill_long``) changed none of the 28
(nor t1d-long at a quarter of the batch) and was removed.
"""

from __future__ import annotations

# ----- the window (dcp.planner.window) -------------------------------------------------------------------
DEFAULT_LOOKAHEAD_PER_RANK = 32
"""Minimum look-ahead samples per rank when advanced.lookahead_samples is 0 (4 * world_size * 8).
Trades: a floor on the window for light-tailed data, where the work-sized bound would be tiny."""

LOOKAHEAD_WORK_FACTOR = 4.0
"""Default hard window bound: this many times the samples whose GPU-time fills the longest step Gmax allows
(Gmax x the longest micro-batch) on every rank; the work-sized window normally ends well before it.
Trades: a larger bound lets a step reach further for work to fill a long step (less idle on heavy tails),
at the cost of reordering the stream more (samples trained further from their shuffled position)."""

WINDOW_WORK_FACTOR = 1.5
"""A step's window holds this many times the GPU-work of the step (W x T*), so packing has choice.
Trades: more choice (less idle) against packing time, which grows with the window (1.5: half a step spare)."""

LONG_IDLE = 0.04
"""T* = k x T_long (k <= Gmax) only if the group of the longest micro-batch, filled with the window's work of
its kind, would leave at most this share of the step's GPU-time (W x T*) idle.
Trades: longer targets (fewer steps, fewer gradient syncs) against idle of a rarely-filled longest group
(docs/planner.md, step 2)."""

# ----- packing (dcp.planner.packing) ---------------------------------------------------------------------
OPEN_FILL = 0.8
"""A micro-batch opens a new SP group only if its p's unassigned window work, less what the open groups of
that p still lack, is at least this fraction of the target time (else the group would idle).
Trades: fewer, fuller groups (lower idle) against leaving ranks free for the second pass and fillers."""

BULK_MIN_RANKS = 512
"""From this world size the passes that re-pack a step many times are skipped: the other targets of a step at a
global batch (``step._other_targets``; the room it kept becomes the step's upper bound instead), the other shares
of the last two steps (``tail``: tried only where the plain tail leaves the bounds), the local search's swaps
(``improve``) and the sync-aware ends (``syncend``); a step at a global batch starts instead at the wanted tokens'
work over the world, at least its head's time (``step_tokens.short_target``). Every world size packs with the same best fit.
Trades: planning time (with them, t1d-long at 4096 H200 ranks planned 5 steps in over 10 minutes of CPU; without,
66 ms a step) against idle they remove below it; at 480-544 ranks the epoch's idle stays within 0.025 across 512
(``test_planner_world_smooth``)."""

# ----- re-packing and local search (dcp.planner.step, dcp.planner.improve) ---------------------------------
RETRY_IDLE = 0.03
"""A packed step idling more than this share (GPU-weighted) is re-packed with the longer targets below.
Trades: each retry is a full packing (the p99 planning time, docs/benchmarks.md) against idle above 3%."""

RETRY_STRETCH = (0.05, 0.1, 0.15, 0.2, 0.3)
"""Relative stretches of T* tried (within Gmax x the step's longest micro-batch) besides the k x T_long
multiples. With them t1d-long DCP-intra went from 5.0% to 2.8% idle at 32 H200 GPUs (commit d1979ee)."""

SHORTER_GAIN = 0.05
"""A shorter target replaces T* only if it idles this much less (GPU-weighted share).
Trades: a shorter step pays the gradient sync and optimizer step more often; 5 points pays for it."""

HEAD_ALONE = 0.8
"""The head is packed again without its own group (``dcp.planner.improve.join_head``) only when that group
holds less than this share of the step's time: its kind lacks work in the window, and its ranks may serve a
larger group better. t1d-long DCP-intra idle 10.4% -> 5.0% at 32 H200 GPUs (commit 3ae9c5d)."""

IMPROVE_GROUPS = 256
"""Local search visits at most this many of the emptiest groups per step.
Trades: planning time at large W (a Python step per swap) against the last points of idle."""

IMPROVE_MIN = 0.005
"""Groups idle for less than this share of the step are left as they are (and a step idling less than this
is not searched at all). Trades: planning time against sub-percent idle."""

# ----- micro-batches sized in tokens (dcp.planner.tokens) -----------------------------------------------
TOKEN_PACK_GAIN = 0.02
"""A seq_group packs its micro-batches by tokens only when that is predicted at least this much cheaper per
token (GPU-seconds per token) than its sample-count micro-batches. Trades: a margin keeps groups whose documents
sit near their bound on sample counts (same work, fewer plan changes) against the gain a smaller one would take."""

# ----- a step at a global batch, balanced after packing (dcp.planner.balance) -------------------------------
BALANCE_BISECT = 8
"""Bisection steps of the shed goal between the step's work over the world and its time.
Trades: planning time (one shed pass per step) against the last percent of the step's time."""

BALANCE_MIN_GAIN = 0.005
"""A balanced step replaces the packed one only when its slowest group finishes at least this share earlier
(it moves micro-batches to less efficient settings; a smaller gain is noise)."""

SHRINK_SHARE = 0.6
"""A group is tried at a smaller p only when it runs at most this share of the step's time (halving p about
doubles its time, which must stay within the step)."""

SHRINK_ROUNDS = 4
"""Rounds of ``dcp.planner.balance``'s layout changes (one group halved, or the slowest group split, per
round). Trades: planning time against groups that need more than one halving."""

ADD_TRIES = 8
"""Window micro-batches tried per group with room when ``dcp.planner.balance`` adds left-overs (the longest
whose work could fit first). Trades: planning time against slack left in the step's groups."""

FILL_AHEAD_STEPS = 2.0
"""``dcp.planner.balance.fill_ahead`` fills an idle step with tokens taken ahead only while at least this many
target steps of tokens are left after the wanted ones. Trades: text at seed 2 (0.9580 -> 0.9554 without it: its
last step, planned with the one before it, left 0.61 x target at 18% idle) against idle steps before the tail."""

# ----- a step at a global batch (dcp.planner.step) -------------------------------------------------------
TOKEN_SLACK = 1.75
"""A step at a global batch packs from a window of at most this many times the tokens it wants. Trades: choice
for the packing and the balance (``dcp.planner.balance``) against reordering the stream further. 1.25 -> 1.75:
DCP-intra at 32 H200 (``dcp bench peers``) t1d-short/balanced/long 0.938/0.925/0.912 -> 0.947/0.939/0.921 of
the ideal bound, text 0.914 -> 0.923, t2d +0.001-0.003; 2.0 and 2.5 gain nothing more."""

END_STRETCHES = 40
"""At the epoch's end a step at a global batch stretches T* by 10% up to this many times to take all that is
left (its packing may leave a few micro-batches that no group has room for; 1.1^40 = 45x)."""

LOW_STRETCHES = 16
"""A step at a global batch whose packing holds fewer tokens than the lower bound stretches T* (and its
window) by 10% up to this many times until it holds them."""

LIFT_FILL = 0.05
"""``_lift_low`` takes a step nearer the wanted tokens for one far past them if its ``fill_share`` is at most
this much lower (0: 3 of 240 small epochs' means 5.3% over the target; 0.2: DCP-inter t1d-long 0.809 -> 0.801)."""

# ----- the dense window (dcp.planner.dense) --------------------------------------------------------------
DENSE_LONG = 1.5
"""Only for a step whose T* is at least this many times its wanted tokens' work spread over the world (a long
micro-batch sets it). t1d-balanced at 32 H200 (``dcp bench peers``'s setup), seeds 0-5: 1.25 and 1.5 gave the same,
2.5 gave back most of the gain on seed 0 (0.971 -> 0.960); with no such bound (every retried step) t1d-balanced fell
from 0.945 to 0.941 and t1d-long from 0.983 to 0.979."""

DENSE_WORK = 2.0
"""The dense window's scan reaches this many times W x T* of work (``window.scan``; 1.25 gave the same) ..."""

DENSE_REACH = 2.0
"""... and no further than this many times the step's most tokens in release order (1.25: t1d-balanced seed 0
0.948, seeds 1 and 2 0.954 / 0.932, below the plain windows)."""

# ----- DCP-intra settings (dcp.planner.intra) ------------------------------------------------------------
BATCH_STRETCH = 1.5
"""A seq_group keeps its own SP size and recompute at a global batch (a smaller b is allowed) while its
micro-batch lasts at most this many times the step the batch implies: a rarer, larger SP size for a few long
samples leaves ranks its kind cannot fill
(text: 128k-token documents moved from p = 8 to p = 16 took DCP-intra from 0.86 to 0.66 of ideal)."""

# ----- sync-aware ends (dcp.planner.syncend) -------------------------------------------------------------
GAIN_EPS_S = 1e-3
"""A move is taken only when it ends the bottleneck group's sync more than this earlier (seconds)."""

MAX_MOVES_PER_GROUP = 3
"""Moves per busy group of a step at most (each lowers the bottleneck group's sync end; text, t1d-short and
t1d-balanced at 32 H200, seed 0: 2 and 3 plan alike, 0.9673 / 0.9769 / 0.9767 of the ideal bound)."""

SHED_RECEIVERS = 4
"""Groups that may receive the bottleneck's samples in their last micro-batch: this many of its p and this many
of any other p, least-ended first (text at 32 H200, seed 0: 2 of its p only, before the other p were added, 0.964
of the ideal bound; 2 + 2 0.9658, 4 + 4 0.9673, 6 + 6 0.9675)."""
