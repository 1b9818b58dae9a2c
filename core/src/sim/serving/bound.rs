//! How few GPUs any policy could need: a proven lower bound, and the
//! central-queue EDF estimate beside it.
//!
//! ```text
//!   mandatory-part bound (proven, S < 2)       central-queue EDF (estimate)
//!   every met job runs during                  one queue for all GPUs, every
//!   [deadline − e, arrival + e): at most       model resident, no load cost;
//!   one per GPU at a time; drop at most the    a job starts on any GPU with
//!   miss budget (greedy, optimal) ─▶ GPUs      its share free, dropped once hopeless
//! ```
//!
//! **The mandatory-part bound.** A request of service time `e` on a whole
//! GPU and saturation share `σ` that meets its deadline `d` (arrival `a`)
//! runs at some fixed share `c` for `e · max(1, σ / c) ≥ e`, starting no
//! earlier than `a` and no later than `d − e · max(1, σ/c)`, so it is
//! running throughout `[d − e, a + e)`, non-empty when `d − a < 2e` (slack
//! below 2). It needs `c ≥ σ · e / (d − a)`; when that is above half a GPU,
//! no two such requests share a GPU at any moment. So at every instant the
//! met "heavy" requests whose mandatory part covers it are at most the GPU
//! count. Meeting ≥ the target attainment allows a miss budget of `k`
//! requests; the fewest requests to drop so that no instant is covered more
//! than `m` times is found exactly by the greedy sweep that, whenever `m`
//! is exceeded, drops the covering interval that ends last (the maximum
//! `m`-colourable subgraph of an interval graph; Yannakakis and Gavril,
//! 1987; Carlisle and Lloyd, 1995). The smallest `m` whose drops fit the
//! budget is a lower bound for every policy of the simulator, and for any
//! non-preemptive schedule on the latency model. At slack ≥ 2 there is no
//! mandatory part and the bound is the trivial 1 GPU. A batching function's
//! request may join a batch on a small share (running longer than `e`), so
//! only that share counts for it (the LLM workload: never heavy).
//!
//! **The memory-time bound.** A met request whose model's fastest load
//! `L` (swap-in or cold start) plus its service `e` exceeds its window
//! `d − a` ran on a copy issued by `d − e − L < a` that stayed until it
//! finished (`≥ a + e`): at every instant, the distinct models with such a
//! met request covering it hold their memory at once, at most `m` GPUs'
//! worth. The misses needed to fit, bounded from below per instant (the
//! fractional optimum of dropping whole models) and summed over instants
//! no interval covers two of (weighted interval scheduling), must fit the
//! miss budget ([`memory_time_min_gpus`]).
//!
//! **The compute-time bound.** While a met request runs through its
//! mandatory part, its model's instance holds at least the share of its
//! GPU's compute that finishes it in its window, `σ·e / (d − a)` (its
//! batch's share), less one batch member's own part: at every instant the
//! distinct models with such a met request covering it hold, together, at
//! most `m × 1000` milli-GPU; the misses needed to fit are bounded as for
//! the memory-time bound ([`compute_time_min_gpus`]).
//!
//! **The demand bound.** A met request of a function that does not batch
//! holds its own share `c` for `e·max(1, σ/c)` between its arrival and its
//! deadline: at least `σ·e` of compute × time that no other request
//! shares. In any interval `[t1, t2]` the met requests whose whole window
//! lies in it need at most `m × 1000 × (t2 − t1)`; the misses needed to
//! fit, summed over disjoint intervals, must fit the miss budget
//! ([`demand_min_gpus`]). `bound` reports the largest of the four proven
//! bounds.
//!
//! **The EDF estimate is not a bound.** Maximising the number of requests
//! that meet their deadlines is NP-hard even on one machine
//! (1|r_j|ΣU_j), and a work-conserving EDF can lose to a policy that is
//! slowed down: a 10 s request (deadline 20 s) that arrives at 0 takes the
//! only GPU, so a 1 s request arriving at 1 s with deadline 2 s misses; a
//! policy whose 10 s request first waits 1.8 s for a swap-in serves both.
//! It is reported as an estimate (`edf_min_gpus`), never called a limit.
//! On the LLM workload it keeps every requested model resident: it serves
//! nothing on fewer GPUs than first-fit decreasing packs their memory into.

use super::engine::{deadline, Billing};
use super::{RunReport, RunSpec, ServingParams, ServingTrace};
use crate::executor::{ExecutorRules, NodeConfig};
use crate::model::{Micros, MilliGpu, WHOLE_GPU};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

/// Which argument gives [`mandatory_min_gpus`] its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundKind {
    /// Overlapping mandatory parts of requests that cannot share a GPU.
    MandatoryPart,
    /// Models whose weights cannot be loaded within a request's slack must
    /// be resident at once (see [`memory_time_min_gpus`]).
    MemoryTime,
    /// Models with a met request in its mandatory part each hold a share
    /// of a GPU's compute at once (see [`compute_time_min_gpus`]).
    ComputeTime,
    /// The compute work of the met requests whose whole window lies in
    /// one interval exceeds what the GPUs do in it (see
    /// [`demand_min_gpus`]).
    Demand,
    /// No such overlap (e.g. slack ≥ 2): one GPU.
    Trivial,
}

impl BoundKind {
    /// The name used in the JSON (`bound_kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            BoundKind::MandatoryPart => "mandatory-part",
            BoundKind::MemoryTime => "memory-time",
            BoundKind::ComputeTime => "compute-time",
            BoundKind::Demand => "demand",
            BoundKind::Trivial => "trivial",
        }
    }
}

/// The largest number of missed requests out of `n` that still reaches `target`.
pub fn miss_budget(n: u64, target: f64) -> u64 {
    let ok = |k: u64| n == 0 || (n - k) as f64 / n as f64 >= target;
    // Binary search the largest k with ok(k); ok is monotone decreasing.
    let (mut lo, mut hi) = (0u64, n);
    if !ok(0) {
        return 0;
    }
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if ok(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Mandatory parts `[d − e, a + e)` of the requests no two of which can
/// share a GPU, sorted by start.
fn mandatory_parts(trace: &ServingTrace, slack: f64) -> Vec<(Micros, Micros)> {
    let mut parts: Vec<(Micros, Micros)> = trace
        .requests
        .iter()
        .filter_map(|r| {
            let e = r.full_gpu_us;
            let window = deadline(r.arrival_us, e, slack) - r.arrival_us;
            let profile = trace.functions[r.function as usize].profile;
            // A batch member may run on the batch's small share (for longer
            // than e): only that share is certain.
            let sigma = profile
                .batched(e, profile.saturation_milli.clamp(1, WHOLE_GPU), 1)
                .1 as u128;
            // Share needed: σ·e/window > 500 milli ⇔ 2·σ·e > 1000·window.
            let heavy = 2 * sigma * e as u128 > WHOLE_GPU as u128 * window as u128;
            let start = r.arrival_us + window - e.min(window);
            let end = r.arrival_us + e;
            (heavy && e > 0 && start < end).then_some((start, end))
        })
        .collect();
    parts.sort_unstable();
    parts
}

/// Fewest intervals of `parts` (sorted by start) to drop so that no
/// instant is covered by more than `m`: the greedy that drops the covering
/// interval ending last is optimal for interval graphs.
fn fewest_drops(parts: &[(Micros, Micros)], m: usize) -> u64 {
    let mut active: BTreeSet<(Micros, usize)> = BTreeSet::new();
    let mut drops = 0;
    for (i, &(start, end)) in parts.iter().enumerate() {
        while active.first().is_some_and(|&(e, _)| e <= start) {
            active.pop_first();
        }
        active.insert((end, i));
        if active.len() > m {
            active.pop_last();
            drops += 1;
        }
    }
    drops
}

/// The proven lower bound on the GPUs any policy needs to reach `target`
/// attainment on `trace` at `slack` (see the module docs), and which
/// argument gives it.
pub fn mandatory_min_gpus(trace: &ServingTrace, slack: f64, target: f64) -> (u32, BoundKind) {
    let parts = mandatory_parts(trace, slack);
    let budget = miss_budget(trace.requests.len() as u64, target);
    if fewest_drops(&parts, 1) <= budget {
        return (1, BoundKind::Trivial);
    }
    // drops(m) is non-increasing in m and 0 at m = parts.len().
    let (mut lo, mut hi) = (1usize, parts.len());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fewest_drops(&parts, mid) <= budget {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    (
        u32::try_from(hi).unwrap_or(u32::MAX),
        BoundKind::MandatoryPart,
    )
}

/// The shortest time any policy of the simulator takes to bring `memory_mib`
/// onto a GPU from outside the GPUs: a swap-in or a cold start, whichever
/// is shorter (a move between GPUs takes a swap-in too).
fn min_load_us(params: &ServingParams, memory_mib: u64) -> Micros {
    params
        .load
        .swap_in_us(memory_mib)
        .min(params.load.cold_start_us(memory_mib))
}

/// The instants where the memory-time bound looks, and what must be
/// resident there (see [`memory_time_min_gpus`]).
#[derive(Debug, Default)]
struct Residency {
    /// Per instant: (instant, the latest end of a forced interval covering
    /// it, range of `models`, Σ memory of those models).
    instants: Vec<(Micros, Micros, std::ops::Range<usize>, u128)>,
    /// (forced requests of the model covering the instant, its memory MiB),
    /// per instant ascending by requests per MiB.
    models: Vec<(u64, u64)>,
}

/// Every "forced" request (its model's fastest load plus its service does
/// not fit its deadline window) as `(start, end, function)`: the interval
/// `[d − e − L, a + e)` in which a copy of its model must be on some GPU if
/// it is met.
fn forced_intervals(
    trace: &ServingTrace,
    params: &ServingParams,
    slack: f64,
) -> Vec<(Micros, Micros, u32)> {
    let mut v: Vec<(Micros, Micros, u32)> = trace
        .requests
        .iter()
        .filter_map(|r| {
            let e = r.full_gpu_us;
            let d = deadline(r.arrival_us, e, slack);
            let mem = trace.functions[r.function as usize].profile.memory_mib;
            let load = min_load_us(params, mem);
            // Forced: a + L + e > d, so the copy it runs on was being
            // loaded before a.
            let forced = r.arrival_us.saturating_add(load).saturating_add(e) > d;
            let start = d.saturating_sub(e.saturating_add(load));
            let end = r.arrival_us.saturating_add(e);
            (forced && mem > 0 && start < end).then_some((start, end, r.function))
        })
        .collect();
    v.sort_unstable();
    v
}

impl Residency {
    /// Sweep the intervals `parts` (sorted by start, each with its
    /// model): at each distinct start, the models with an interval covering
    /// it, their counts and their weight (`weight(model)`: memory MiB for
    /// the memory-time bound, milli-GPU for the compute-time bound).
    fn new(
        trace: &ServingTrace,
        parts: &[(Micros, Micros, u32)],
        weight: impl Fn(u32) -> u64,
    ) -> Self {
        let mut active: BTreeSet<(Micros, usize)> = BTreeSet::new();
        let mut count: Vec<u64> = vec![0; trace.functions.len()];
        let mut present: Vec<u32> = Vec::new();
        let mut out = Residency::default();
        for (i, &(start, end, f)) in parts.iter().enumerate() {
            while let Some(&(e, k)) = active.first() {
                if e > start {
                    break;
                }
                active.pop_first();
                let g = parts[k].2;
                count[g as usize] -= 1;
                if count[g as usize] == 0 {
                    present.retain(|&x| x != g);
                }
            }
            active.insert((end, i));
            if count[f as usize] == 0 {
                present.push(f);
            }
            count[f as usize] += 1;
            if parts.get(i + 1).is_some_and(|n| n.0 == start) {
                continue;
            }
            let from = out.models.len();
            let mut total: u128 = 0;
            for &g in &present {
                let m = weight(g);
                total += u128::from(m);
                out.models.push((count[g as usize], m));
            }
            // Cheapest to drop first: fewest requests per MiB freed.
            out.models[from..].sort_unstable_by(|a, b| {
                (u128::from(a.0) * u128::from(b.1)).cmp(&(u128::from(b.0) * u128::from(a.1)))
            });
            let latest = active.last().map_or(end, |&(e, _)| e);
            out.instants
                .push((start, latest, from..out.models.len(), total));
        }
        out
    }

    /// A lower bound on the misses needed at one instant so that the
    /// models left fit `capacity` MiB: the fractional (LP) optimum of
    /// dropping whole models, rounded up.
    fn drops_at(&self, k: usize, capacity: u128) -> u64 {
        let (_, _, ref range, total) = self.instants[k];
        let Some(mut need) = total.checked_sub(capacity).filter(|&n| n > 0) else {
            return 0;
        };
        let mut drops: u64 = 0;
        for &(n, mem) in &self.models[range.clone()] {
            let mem = u128::from(mem);
            if mem >= need {
                let part = (u128::from(n) * need).div_ceil(mem);
                return drops.saturating_add(u64::try_from(part).unwrap_or(u64::MAX));
            }
            drops = drops.saturating_add(n);
            need -= mem;
        }
        drops
    }

    /// A lower bound on the misses any schedule on `m` GPUs of `gpu_mib`
    /// needs: the largest sum of [`Self::drops_at`] over instants no forced
    /// interval covers two of (weighted interval scheduling, exact).
    fn drops(&self, m: u32, gpu_mib: u64) -> u64 {
        let capacity = u128::from(m) * u128::from(gpu_mib);
        let n = self.instants.len();
        // best[i]: the most over instants i.. (sorted by instant).
        let mut best: Vec<u64> = vec![0; n + 1];
        for i in (0..n).rev() {
            let (_, latest, _, _) = self.instants[i];
            let next = i + self.instants[i..].partition_point(|x| x.0 < latest);
            let take = self.drops_at(i, capacity).saturating_add(best[next]);
            best[i] = best[i + 1].max(take);
        }
        best[0]
    }
}

/// The memory-time bound (proven; see docs/serving.md): a met request
/// whose model's fastest load `L` (swap-in or cold start) plus its service
/// `e` exceeds its window `d − a` runs on a copy that started loading by
/// `d − e − L < a` and stays until it finishes at `≥ a + e`; so at every
/// instant the distinct models with such a met request covering it are on
/// the GPUs at once, and their memory is at most `m` × the GPU memory. At
/// instants that no such interval covers two of, the misses needed to fit
/// add up; the smallest `m` whose lower bound on misses fits the budget is
/// a lower bound for every policy of the simulator.
pub fn memory_time_min_gpus(
    trace: &ServingTrace,
    params: &ServingParams,
    slack: f64,
    target: f64,
) -> u32 {
    let parts = forced_intervals(trace, params, slack);
    let residency = Residency::new(trace, &parts, |f| {
        trace.functions[f as usize].profile.memory_mib
    });
    let budget = miss_budget(trace.requests.len() as u64, target);
    residency.min_gpus(budget, params.gpu_memory_mib.max(1))
}

impl Residency {
    /// The smallest GPU count, each of `per_gpu` weight, whose lower bound
    /// on misses ([`Self::drops`]) fits `budget`.
    fn min_gpus(&self, budget: u64, per_gpu: u64) -> u32 {
        // drops(m) is non-increasing in m and 0 once m GPUs hold every sum.
        let most = self
            .instants
            .iter()
            .map(|x| x.3)
            .max()
            .unwrap_or(0)
            .div_ceil(u128::from(per_gpu));
        if self.drops(1, per_gpu) <= budget {
            return 1;
        }
        let (mut lo, mut hi) = (1u32, u32::try_from(most).unwrap_or(u32::MAX).max(2));
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.drops(mid, per_gpu) <= budget {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }
}

/// The compute a model's instance certainly holds on its GPU while a met
/// request of it runs, milli-GPU: `⌈σ·e / (d − a)⌉` (no share slower
/// than that finishes it in its window), less one batch member's share
/// `⌈σ·batch_ppm / 10⁶⌉` (the batch's first request may have left while
/// this one still runs; see [`compute_time_min_gpus`]).
fn held_share(saturation_milli: MilliGpu, batch_ppm: u32, e: Micros, window: Micros) -> u64 {
    let sigma = u128::from(saturation_milli.clamp(1, WHOLE_GPU));
    let need = (sigma * u128::from(e)).div_ceil(u128::from(window.max(1)));
    let member = (sigma * u128::from(batch_ppm)).div_ceil(1_000_000);
    u64::try_from(need.saturating_sub(member)).unwrap_or(u64::MAX)
}

/// The compute-time bound (proven; see docs/serving.md): a met request
/// runs throughout its mandatory part `[d − e, a + e)` (non-empty at slack
/// below 2), and all that time its model's instance holds at least
/// [`held_share`] of its GPU's compute (its batch's share, which is what
/// finishes it in time, less the first member's own part); the GPUs'
/// compute is at most `m × 1000` milli. So at every instant the distinct
/// models with a met request whose mandatory part covers it have weights
/// (the least such share over the model's requests) summing to at most
/// `m × 1000`; the misses needed to fit, summed over instants no mandatory
/// part covers two of, must fit the miss budget, as for
/// [`memory_time_min_gpus`].
pub fn compute_time_min_gpus(trace: &ServingTrace, slack: f64, target: f64) -> u32 {
    let mut weight: Vec<u64> = vec![u64::MAX; trace.functions.len()];
    let mut parts: Vec<(Micros, Micros, u32)> = trace
        .requests
        .iter()
        .filter_map(|r| {
            let e = r.full_gpu_us;
            let d = deadline(r.arrival_us, e, slack);
            let (start, end) = (d.saturating_sub(e), r.arrival_us.saturating_add(e));
            let profile = trace.functions[r.function as usize].profile;
            let held = held_share(
                profile.saturation_milli,
                profile.batch_ppm,
                e,
                d.saturating_sub(r.arrival_us),
            );
            (start < end && held > 0).then(|| {
                let w = &mut weight[r.function as usize];
                *w = (*w).min(held);
                (start, end, r.function)
            })
        })
        .collect();
    parts.sort_unstable();
    let residency = Residency::new(trace, &parts, |f| weight[f as usize]);
    let budget = miss_budget(trace.requests.len() as u64, target);
    residency.min_gpus(budget, u64::from(WHOLE_GPU))
}

/// The least compute work a met request costs, milli-GPU × µs, that no
/// other request shares: `σ·e` for a function that does not batch (its
/// own share `c` runs it for `e·σ/c` when `c < σ`, no faster than `e`
/// when larger, squeezed or not). 0 for a batching function: under the
/// slotted rules a batch joiner runs on the slot's hold and takes no
/// compute of its own.
fn least_work(saturation_milli: MilliGpu, batch_ppm: u32, e: Micros) -> u128 {
    if batch_ppm == 0 {
        u128::from(saturation_milli.clamp(1, WHOLE_GPU)) * u128::from(e)
    } else {
        0
    }
}

/// Per request with a [`least_work`], by arrival: (arrival, deadline, work).
fn demands(trace: &ServingTrace, slack: f64) -> Vec<(Micros, Micros, u128)> {
    let mut v: Vec<(Micros, Micros, u128)> = trace
        .requests
        .iter()
        .filter_map(|r| {
            let e = r.full_gpu_us;
            let profile = trace.functions[r.function as usize].profile;
            let work = least_work(profile.saturation_milli, profile.batch_ppm, e);
            let d = deadline(r.arrival_us, e, slack);
            // A window of no length is never met: it needs no room.
            (work > 0 && d > r.arrival_us).then_some((r.arrival_us, d, work))
        })
        .collect();
    v.sort_unstable_by_key(|&(a, d, _)| (a, d));
    v
}

/// A lower bound on the misses any schedule on `m` GPUs needs (see
/// [`demand_min_gpus`]): the largest sum, over intervals `[t1, t2]` (`t1`
/// an arrival, `t2` a deadline) no two of which overlap, of the drops each
/// needs, the excess work inside over the largest work inside (weighted
/// interval scheduling, exact over these intervals). Each interval's drops
/// only shrink as `m` grows, so the sum does too.
fn demand_drops(jobs: &[(Micros, Micros, u128)], m: u32) -> u64 {
    let n = jobs.len();
    let capacity = u128::from(m) * u128::from(WHOLE_GPU);
    // Ranks by deadline (ties by index); `work[r]` is the work of the job
    // of rank r once its arrival is at or after the current t1 (jobs are
    // added from the last arrival back), else 0.
    let mut by_deadline: Vec<usize> = (0..n).collect();
    by_deadline.sort_unstable_by_key(|&k| (jobs[k].1, k));
    let mut rank = vec![0usize; n];
    for (r, &k) in by_deadline.iter().enumerate() {
        rank[k] = r;
    }
    let deadlines: Vec<Micros> = by_deadline.iter().map(|&k| jobs[k].1).collect();
    let mut work = vec![0u128; n];
    // total[i]: the most drops over disjoint intervals starting at or after
    // the arrival of job i (jobs by arrival); final for every j > i when
    // job i is reached.
    let mut total: Vec<u64> = vec![0; n + 1];
    for i in (0..n).rev() {
        work[rank[i]] = jobs[i].2;
        total[i] = total[i + 1];
        let t1 = jobs[i].0;
        if i > 0 && jobs[i - 1].0 == t1 {
            // The same t1 with more jobs comes next: it dominates.
            continue;
        }
        let (mut sum, mut largest) = (0u128, 0u128);
        // The first job arriving at or after t2, for the intervals after
        // [t1, t2]: t2 only grows in this sweep.
        let mut next = i + 1;
        for r in deadlines.partition_point(|&d| d <= t1)..n {
            let w = work[r];
            sum += w;
            largest = largest.max(w);
            let t2 = deadlines[r];
            // The next rank with the same deadline adds more: look there.
            if sum == 0 || deadlines.get(r + 1) == Some(&t2) {
                continue;
            }
            let room = capacity * u128::from(t2 - t1);
            if sum > room {
                while next < n && jobs[next].0 < t2 {
                    next += 1;
                }
                let drops = u64::try_from((sum - room).div_ceil(largest)).unwrap_or(u64::MAX);
                total[i] = total[i].max(drops.saturating_add(total[next]));
            }
        }
    }
    total[0]
}

/// The demand bound (proven; see docs/serving.md): a met request runs
/// only between its arrival and its deadline and costs at least
/// [`least_work`] of a GPU's compute there; `m` GPUs do at most
/// `m × 1000` milli-GPU × µs per µs. So in every interval `[t1, t2]` the
/// met requests whose whole window lies in it need at most
/// `m × 1000 × (t2 − t1)`; the misses needed to fit (at least the excess
/// over the largest work inside), summed over disjoint intervals, must
/// fit the miss budget. Unlike the mandatory-part and compute-time bounds
/// this counts requests at any slack. It looks at intervals that start at
/// an arrival and end at a deadline (any subset of intervals gives a
/// valid bound).
pub fn demand_min_gpus(trace: &ServingTrace, slack: f64, target: f64) -> u32 {
    let jobs = demands(trace, slack);
    let budget = miss_budget(trace.requests.len() as u64, target);
    if demand_drops(&jobs, 1) <= budget {
        return 1;
    }
    // drops(m) is non-increasing in m (see demand_drops) and 0 once one
    // GPU's worth of room per µs holds every request's work: double, then
    // bisect.
    let mut hi = 2u32;
    while demand_drops(&jobs, hi) > budget && hi < u32::MAX / 2 {
        hi = hi.saturating_mul(2);
    }
    let mut lo = hi / 2;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if demand_drops(&jobs, mid) <= budget {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// The proven lower bound: the largest of the mandatory-part, the
/// memory-time, the compute-time and the demand bounds, and which gives it
/// (on a tie the first of those).
pub fn proven_min_gpus(
    trace: &ServingTrace,
    params: &ServingParams,
    slack: f64,
    target: f64,
) -> (u32, BoundKind) {
    let mandatory = mandatory_min_gpus(trace, slack, target);
    let memory = memory_time_min_gpus(trace, params, slack, target);
    let compute = compute_time_min_gpus(trace, slack, target);
    let demand = demand_min_gpus(trace, slack, target);
    if demand > mandatory.0.max(memory).max(compute) {
        (demand, BoundKind::Demand)
    } else if compute > mandatory.0.max(memory) {
        (compute, BoundKind::ComputeTime)
    } else if memory > mandatory.0 {
        (memory, BoundKind::MemoryTime)
    } else {
        mandatory
    }
}

/// GPUs of `gpu_mib` that first-fit decreasing packs the memory of every
/// model with a request into (an estimate's memory constraint: FFD may use
/// more GPUs than the best packing, never fewer).
pub fn ffd_memory_gpus(trace: &ServingTrace, gpu_mib: u64) -> u32 {
    let mut used = vec![false; trace.functions.len()];
    for r in &trace.requests {
        used[r.function as usize] = true;
    }
    let mut sizes: Vec<u64> = trace
        .functions
        .iter()
        .zip(&used)
        .filter(|(_, &u)| u)
        .map(|(f, _)| f.profile.memory_mib)
        .collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let mut free: Vec<u64> = Vec::new();
    for s in sizes {
        match free.iter_mut().find(|f| **f >= s) {
            Some(f) => *f -= s,
            // A model larger than a GPU still takes one (the trace
            // builders refuse such models).
            None => free.push(gpu_mib.saturating_sub(s)),
        }
    }
    u32::try_from(free.len()).unwrap_or(u32::MAX)
}

/// A queued request of the EDF estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Job {
    deadline: Micros,
    request: u32,
}

/// The central-queue EDF estimate on `spec.gpus` GPUs: one queue, earliest
/// deadline first, every model resident everywhere at no cost, each request
/// on its saturation share for its whole-GPU service time, started on the
/// GPU with the least free compute that fits it, dropped once it can no
/// longer meet its deadline. Billed at the `exclusive` tier. Where the
/// trace's models stay resident (the LLM workload), every model with a
/// request must be resident somewhere: on fewer GPUs than
/// [`ffd_memory_gpus`] packs them into, it serves nothing (each arrival is
/// rejected).
pub fn edf_simulate(trace: &ServingTrace, params: &ServingParams, spec: RunSpec) -> RunReport {
    let gpus = spec.gpus.max(1);
    if trace.models_stay_resident && gpus < ffd_memory_gpus(trace, params.gpu_memory_mib) {
        let n = trace.requests.len() as u64;
        let mut report = RunReport::empty(spec.policy, gpus, n, params);
        report.events = n;
        report.rejected = n;
        report.span_us = trace.requests.last().map_or(0, |r| r.arrival_us);
        return report;
    }
    let config = NodeConfig {
        gpus,
        gpu_memory_mib: params.gpu_memory_mib,
        host_memory_mib: 0,
        load: params.load,
        rules: ExecutorRules::gshare(),
    };
    let mut billing = Billing::new(trace, &config, spec.policy);
    let n = trace.requests.len();
    let mut report = RunReport::empty(spec.policy, gpus, n as u64, params);
    let share = |f: u32| -> MilliGpu {
        trace.functions[f as usize]
            .profile
            .saturation_milli
            .clamp(1, WHOLE_GPU)
    };
    let deadlines: Vec<Micros> = trace
        .requests
        .iter()
        .map(|r| deadline(r.arrival_us, r.full_gpu_us, spec.slack))
        .collect();
    // (free compute, gpu) of every GPU.
    let mut free: BTreeSet<(MilliGpu, u32)> = (0..gpus).map(|g| (WHOLE_GPU, g)).collect();
    let mut free_of: Vec<MilliGpu> = vec![WHOLE_GPU; gpus as usize];
    let mut queue: BinaryHeap<Reverse<Job>> = BinaryHeap::new();
    // (finish, gpu, request).
    let mut running: BinaryHeap<Reverse<(Micros, u32, u32)>> = BinaryHeap::new();
    let mut latencies: Vec<Micros> = Vec::with_capacity(n);
    let mut cursor = 0usize;
    let mut now: Micros = 0;
    loop {
        let next_arrival = trace.requests.get(cursor).map(|r| r.arrival_us);
        let next_finish = running.peek().map(|Reverse(r)| r.0);
        match (next_arrival, next_finish) {
            (None, None) => break,
            (Some(a), Some(f)) if f <= a => now = f,
            (None, Some(f)) => now = f,
            (Some(a), _) => now = a,
        }
        report.events += 1;
        if next_finish == Some(now) {
            let Reverse((_, g, r)) = running.pop().expect("peeked");
            let c = share(trace.requests[r as usize].function);
            let f = &mut free_of[g as usize];
            free.remove(&(*f, g));
            *f += c;
            free.insert((*f, g));
        } else {
            queue.push(Reverse(Job {
                deadline: deadlines[cursor],
                request: cursor as u32,
            }));
            cursor += 1;
        }
        while let Some(&Reverse(job)) = queue.peek() {
            let r = trace.requests[job.request as usize];
            if now + r.full_gpu_us > job.deadline {
                queue.pop();
                report.rejected += 1;
                continue;
            }
            let c = share(r.function);
            let Some(&(f, g)) = free.range((c, 0)..).next() else {
                break;
            };
            queue.pop();
            free.remove(&(f, g));
            free.insert((f - c, g));
            free_of[g as usize] = f - c;
            let finish = now + r.full_gpu_us;
            running.push(Reverse((finish, g, job.request)));
            report.met += 1;
            latencies.push(finish - r.arrival_us);
            report.busy_us_milli += r.full_gpu_us as u128 * c as u128;
            billing.add(r.function, r.full_gpu_us, c);
        }
    }
    report.span_us = now;
    report.billed_units = billing.bill(params);
    report.set_percentiles(&mut latencies);
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::FunctionProfile;
    use crate::model::Tier;
    use crate::sim::serving::{ServingPolicy, TraceFunction, TraceRequest};

    const S: Micros = 1_000_000;

    fn trace(sigma: MilliGpu, requests: &[(Micros, Micros)]) -> ServingTrace {
        ServingTrace {
            name: "t".into(),
            functions: vec![TraceFunction {
                name: "f".into(),
                profile: FunctionProfile {
                    tier: Tier::Oversubscribed,
                    memory_mib: 1_000,
                    saturation_milli: sigma,
                    batch_ppm: 0,
                },
            }],
            requests: requests
                .iter()
                .map(|&(a, e)| TraceRequest {
                    arrival_us: a,
                    function: 0,
                    full_gpu_us: e,
                })
                .collect(),
            models_stay_resident: false,
        }
    }

    #[test]
    fn the_miss_budget_is_the_most_misses_that_still_reach_the_target() {
        assert_eq!(miss_budget(100, 0.99), 1);
        assert_eq!(miss_budget(14_279, 0.99), 142);
        assert_eq!(miss_budget(99, 0.99), 0);
        assert_eq!(miss_budget(0, 0.99), 0);
        assert_eq!(miss_budget(10, 0.0), 10);
    }

    #[test]
    fn greedy_drops_the_fewest_intervals() {
        // Three intervals cover [2, 3); dropping the one ending last (0..10)
        // leaves [1,3) and [2,4) and frees the later ones.
        let parts = [(0, 10), (1, 3), (2, 4), (5, 7), (6, 8)];
        assert_eq!(fewest_drops(&parts, 2), 1);
        assert_eq!(fewest_drops(&parts, 1), 3);
        assert_eq!(fewest_drops(&parts, 3), 0);
    }

    #[test]
    fn simultaneous_whole_gpu_requests_below_slack_two_need_one_gpu_each() {
        // 100 requests of 10 s at once, slack 1.5: each runs during [5 s, 10 s).
        let t = trace(1000, &[(0, 10 * S); 100]);
        // One may miss: 99 GPUs.
        assert_eq!(
            mandatory_min_gpus(&t, 1.5, 0.99),
            (99, BoundKind::MandatoryPart)
        );
        assert_eq!(mandatory_min_gpus(&t, 2.0, 0.99), (1, BoundKind::Trivial));
        // Half-GPU models can share a GPU: no bound from them.
        let t = trace(500, &[(0, 10 * S); 100]);
        assert_eq!(mandatory_min_gpus(&t, 1.5, 0.99), (1, BoundKind::Trivial));
    }

    #[test]
    fn work_inside_an_interval_must_fit_the_gpus_at_any_slack() {
        // 100 whole-GPU requests of 10 s at once, slack 4: together 1,000
        // GPU-seconds inside [0, 40 s], so 25 GPUs; one may miss (99 %):
        // 990 GPU-seconds, still 25 (24 do 960).
        let t = trace(1000, &[(0, 10 * S); 100]);
        assert_eq!(demand_min_gpus(&t, 4.0, 0.99), 25);
        assert_eq!(demand_min_gpus(&t, 4.0, 1.0), 25);
        // At slack 2 the window is 20 s: 50 GPUs (49.5 with one missed).
        assert_eq!(demand_min_gpus(&t, 2.0, 0.99), 50);
        // Half-GPU requests cost half the work each.
        let t = trace(500, &[(0, 10 * S); 100]);
        assert_eq!(demand_min_gpus(&t, 4.0, 1.0), 13);
        // Spread out (one every 10 s), one GPU does them all.
        let spread: Vec<(Micros, Micros)> = (0..100).map(|i| (i * 10 * S, 10 * S)).collect();
        assert_eq!(demand_min_gpus(&trace(1000, &spread), 1.5, 1.0), 1);
        // Two bursts far apart count their misses together: 60 requests at
        // 0 and 60 at 1,000 s, slack 1 (window = e) on 50 GPUs: each burst
        // misses 10, 20 in all, over a budget of 1 % of 120 (1): 60 GPUs.
        let mut two: Vec<(Micros, Micros)> = vec![(0, 10 * S); 60];
        two.extend(vec![(1_000 * S, 10 * S); 60]);
        let t = trace(1000, &two);
        let jobs = demands(&t, 1.0);
        assert_eq!(demand_drops(&jobs, 50), 20);
        assert_eq!(demand_min_gpus(&t, 1.0, 0.99), 60);
        // Misses only shrink as GPUs are added, even where the interval
        // that needs the most misses alone changes with m: 10 requests of
        // 10 µs at 0 and 22 of 1 µs at 20 (slack 1) need 32 − 2m misses on
        // m GPUs (apart, not as one interval); 2,090 spread 1 µs requests
        // make the budget 21, so 6 GPUs.
        let mut burst: Vec<(Micros, Micros)> = vec![(0, 10); 10];
        burst.extend(vec![(20, 1); 22]);
        burst.extend((0..2_090).map(|i| (1_000 + 100 * i, 1)));
        let t = trace(1000, &burst);
        let jobs = demands(&t, 1.0);
        let drops: Vec<u64> = (1..=6).map(|m| demand_drops(&jobs, m)).collect();
        assert_eq!(drops, [30, 28, 26, 24, 22, 20]);
        assert_eq!(demand_min_gpus(&t, 1.0, 0.99), 6);
        // A window of no length (slack 0 here) is never met and needs no
        // room: the search ends.
        assert_eq!(demand_min_gpus(&trace(1000, &[(0, 10); 5]), 0.0, 0.99), 1);
        // A batching function's joiner may take no compute of its own.
        let mut t = trace(1000, &[(0, 10 * S); 100]);
        t.functions[0].profile.batch_ppm = 100_000;
        assert_eq!(demand_min_gpus(&t, 4.0, 1.0), 1);
    }

    #[test]
    fn edf_runs_earliest_deadline_first_on_any_gpu_and_drops_the_hopeless() {
        // One GPU: a 10 s request, then two 1 s ones arriving at 1 s; the
        // one due at 11.5 s runs at 10 s, the one due at 3 s is dropped.
        let t = trace(1000, &[(0, 10 * S), (S, S), (S, 9 * S + S / 2)]);
        let spec = RunSpec {
            policy: ServingPolicy::Bound,
            static_slices: 1,
            gpus: 1,
            slack: 2.0,
        };
        let r = edf_simulate(&t, &params(), spec);
        // Deadlines: 20 s, 3 s, 1 s + 2 × 9.5 s = 20 s.
        assert_eq!((r.met, r.rejected), (2, 1));
        let r = edf_simulate(&t, &params(), RunSpec { gpus: 2, ..spec });
        assert_eq!((r.met, r.rejected), (3, 0));
    }

    /// `k` models of `mib` each; request `i` of model `i mod k` arrives at
    /// `i × gap` and takes `e`.
    fn models_trace(k: u32, mib: u64, n: u32, gap: Micros, e: Micros) -> ServingTrace {
        let mut t = trace(693, &[]);
        t.models_stay_resident = true;
        t.functions = (0..k)
            .map(|i| TraceFunction {
                name: format!("m{i}"),
                profile: FunctionProfile {
                    tier: Tier::Oversubscribed,
                    memory_mib: mib,
                    saturation_milli: 693,
                    batch_ppm: 38_390,
                },
            })
            .collect();
        t.requests = (0..n)
            .map(|i| TraceRequest {
                arrival_us: Micros::from(i) * gap,
                function: i % k,
                full_gpu_us: e,
            })
            .collect();
        t
    }

    #[test]
    fn models_that_cannot_load_within_their_slack_must_be_resident_together() {
        let p = params();
        assert_eq!(p.gpu_memory_mib, 81_920);
        // Four 30 GiB models, a 100 ms request every 100 ms round-robin:
        // a swap-in (> 1.4 s) never fits 50 ms of slack, so all four are
        // resident at every instant: 120 GiB needs 2 GPUs.
        let t = models_trace(4, 30_720, 2_000, 100_000, 100_000);
        assert_eq!(memory_time_min_gpus(&t, &p, 1.5, 0.99), 2);
        assert_eq!(
            proven_min_gpus(&t, &p, 1.5, 0.99),
            (2, BoundKind::MemoryTime)
        );
        // Eight of them: 240 GiB, 3 GPUs hold 240 GiB exactly.
        let t = models_trace(8, 30_720, 2_000, 100_000, 100_000);
        assert_eq!(memory_time_min_gpus(&t, &p, 1.5, 0.99), 3);
        // With 30 s of slack every model may be loaded on demand.
        assert_eq!(memory_time_min_gpus(&t, &p, 301.0, 0.99), 1);
        // A miss budget of everything needs nothing resident.
        assert_eq!(memory_time_min_gpus(&t, &p, 1.5, 0.0), 1);
    }

    #[test]
    fn models_running_in_their_mandatory_parts_at_once_each_hold_a_share() {
        let p = params();
        // k models of 1 MiB (memory never binds), a 200 ms request every
        // 20 ms round-robin, S = 1.5: each runs throughout [a + 100 ms,
        // a + 200 ms), covered by 5 requests at every instant, and holds
        // ⌈693 / 1.5⌉ − ⌈693 × 3.839 %⌉ = 462 − 27 = 435 milli.
        assert_eq!(held_share(693, 38_390, 200_000, 300_000), 435);
        assert_eq!(held_share(693, 0, 200_000, 300_000), 462);
        // Five models: 5 × 435 = 2 175 milli need 3 GPUs.
        let t = models_trace(5, 1, 2_000, 20_000, 200_000);
        assert_eq!(compute_time_min_gpus(&t, 1.5, 0.99), 3);
        assert_eq!(
            proven_min_gpus(&t, &p, 1.5, 0.99),
            (3, BoundKind::ComputeTime)
        );
        // Four: 1 740 milli, 2 GPUs; one model: its batch on one GPU.
        let t = models_trace(4, 1, 2_000, 20_000, 200_000);
        assert_eq!(compute_time_min_gpus(&t, 1.5, 0.99), 2);
        let t = models_trace(1, 1, 2_000, 20_000, 200_000);
        assert_eq!(compute_time_min_gpus(&t, 1.5, 0.99), 1);
        // No mandatory part at S = 2.
        let t = models_trace(5, 1, 2_000, 20_000, 200_000);
        assert_eq!(compute_time_min_gpus(&t, 2.0, 0.99), 1);
        // A miss budget of everything needs nothing.
        assert_eq!(compute_time_min_gpus(&t, 1.5, 0.0), 1);
    }

    #[test]
    fn drops_at_an_instant_are_the_rounded_up_fractional_optimum() {
        let r = Residency {
            instants: vec![(0, 10, 0..3, 60)],
            // Ascending by requests per MiB.
            models: vec![(1, 30), (2, 20), (5, 10)],
        };
        assert_eq!(r.drops_at(0, 60), 0);
        // 10 MiB over: a third of the first model's one request, rounded up.
        assert_eq!(r.drops_at(0, 50), 1);
        // 40 over: the first model, then half of the second's 2.
        assert_eq!(r.drops_at(0, 20), 2);
        // 55 over: 1 + 2 + half of 5, rounded up.
        assert_eq!(r.drops_at(0, 5), 6);
        assert_eq!(r.drops(1, 5), 6);
    }

    #[test]
    fn first_fit_decreasing_packs_the_requested_models() {
        // 50 + 30 and 40 + 20 GiB on 80 GiB GPUs; the unrequested model
        // does not count.
        let mut t = models_trace(5, 1, 4, 1, 1);
        for (f, gib) in t.functions.iter_mut().zip([50, 40, 30, 20, 70]) {
            f.profile.memory_mib = gib * 1024;
        }
        assert_eq!(ffd_memory_gpus(&t, 80 * 1024), 2);
        t.requests[0].function = 4;
        // 70; 40 + 30; 20 (10 MiB left beside 70, 10 beside 40 + 30).
        assert_eq!(ffd_memory_gpus(&t, 80 * 1024), 3);
        // The EDF estimate serves nothing on fewer GPUs.
        let spec = RunSpec {
            policy: ServingPolicy::Bound,
            static_slices: 1,
            gpus: 2,
            slack: 2.0,
        };
        let r = edf_simulate(&t, &params(), spec);
        assert_eq!((r.met, r.rejected, r.events), (0, 4, 4));
        let r = edf_simulate(&t, &params(), RunSpec { gpus: 3, ..spec });
        assert_eq!(r.met, 4);
    }

    fn params() -> ServingParams {
        ServingParams::from_toml(
            "topology.toml",
            include_str!("../../../../configs/examples/topology.toml"),
        )
        .unwrap()
    }
}
