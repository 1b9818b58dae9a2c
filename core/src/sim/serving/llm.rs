//! The LLM serving workload: the Azure LLM inference trace's arrivals and
//! token counts spread over `M` models of mixed sizes, with a service model
//! of batched prefill and decode on one GPU.
//!
//! ```text
//!   Azure CSV (TIMESTAMP, ContextTokens, GeneratedTokens)
//!        │ each request ─▶ a model drawn by Zipf popularity (seeded)
//!        ▼
//!   M models: weights log-uniform in [0.5, 14] GiB (seeded), popularity
//!   rank a seeded permutation (independent of size)
//!        │
//!        ▼
//!   per request: solo service on a whole GPU at batch 1
//!     e = prefill(context) + (generated − 1) × decode step
//!   per model: share σ of a GPU a batch-1 decode stream attains, and the
//!   batching cost of each extra sequence (FunctionProfile::batch_ppm)
//! ```
//!
//! Constants, all measured on an A100 and scaled by weight size (decode is
//! bound by reading the weights once per step; prefill FLOPs grow with the
//! parameter count):
//!
//! - decode at batch 1: Llama-2-7B in fp16, 104.9 tokens/s (gpt-fast,
//!   PyTorch blog "Accelerating generative AI with PyTorch II: GPT, Fast",
//!   2023) ⇒ 9.53 ms per step for 12,855 MiB of weights; that reads
//!   13.5 GB per step, 1.41 TB/s of the A100-80GB's 2.04 TB/s: a batch-1
//!   stream attains 69 % of the GPU ([`DECODE_SHARE_MILLI`]);
//! - prefill: TensorRT-LLM, LLaMA-7B on A100, first token in 16 ms at 128
//!   input tokens and 133 ms at 2,048 (NVIDIA TensorRT-LLM performance
//!   overview) ⇒ 8.2 ms + 60.9 µs per context token;
//! - batching: TensorRT-LLM, LLaMA-7B on A100, 1,928 output tokens/s at
//!   batch 60 ⇒ a step of 31.1 ms for 60 sequences, so each sequence adds
//!   (31.1 − 9.53) / 59 = 0.366 ms, 3.84 % of the batch-1 step
//!   ([`BATCH_PPM`]);
//! - memory: weights plus a KV reserve of [`KV_RESERVE_TOKENS`] tokens at
//!   Llama-2-7B's 512 KiB per token (2 × 32 layers × 4,096 × 2 bytes),
//!   scaled by size.

use super::trace::parse_datetime_us;
use super::{ServingParams, ServingTrace, TraceError, TraceFunction, TraceRequest};
use crate::executor::FunctionProfile;
use crate::model::{Mib, Micros, MilliGpu, Tier};
use crate::rng::Rng;

/// Llama-2-7B's weights in fp16 (6.74 × 10⁹ parameters × 2 bytes), MiB.
pub const REFERENCE_WEIGHTS_MIB: Mib = 12_855;
/// Its decode step at batch 1 on an A100 (1 / 104.9 tokens/s), µs.
pub const DECODE_STEP_US: Micros = 9_533;
/// Its prefill: fixed part, µs (TensorRT-LLM first-token latencies).
pub const PREFILL_BASE_US: Micros = 8_200;
/// Its prefill per context token, ns ((133 − 16) ms / (2,048 − 128)).
pub const PREFILL_NS_PER_TOKEN: u64 = 60_938;
/// Share of a GPU a batch-1 decode stream attains (1.41 of 2.04 TB/s).
pub const DECODE_SHARE_MILLI: MilliGpu = 693;
/// Service added per sequence already in the batch, ppm of the solo
/// service ((31.1 − 9.53) ms / 59 / 9.53 ms).
pub const BATCH_PPM: u32 = 38_390;
/// KV cache reserved per instance, tokens.
pub const KV_RESERVE_TOKENS: u64 = 8_192;
/// Llama-2-7B's KV cache per token, KiB.
pub const KV_KIB_PER_TOKEN: u64 = 512;
/// Smallest and largest weights of a model, MiB.
pub const WEIGHTS_MIB: (Mib, Mib) = (512, 14_336);
/// Zipf exponent of model popularity.
pub const ZIPF_S: f64 = 1.0;

/// One LLM of the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlmModel {
    /// Weights, MiB.
    pub weights_mib: Mib,
    /// Popularity rank, 1 = most requested.
    pub rank: u32,
}

impl LlmModel {
    /// Weights and KV reserve, MiB.
    pub fn memory_mib(&self) -> Mib {
        let kv = KV_RESERVE_TOKENS * KV_KIB_PER_TOKEN / 1024;
        self.weights_mib + scale(kv, self.weights_mib)
    }

    /// Service time alone on a whole GPU at batch 1: prefill of `context`
    /// tokens, which yields the first token, then a decode step per further
    /// generated token, µs.
    pub fn solo_us(&self, context: u64, generated: u64) -> Micros {
        let prefill_ns = u128::from(PREFILL_BASE_US) * 1_000
            + u128::from(context) * u128::from(PREFILL_NS_PER_TOKEN);
        let decode_ns =
            u128::from(generated.saturating_sub(1)) * u128::from(DECODE_STEP_US) * 1_000;
        let ns = (prefill_ns + decode_ns) * u128::from(self.weights_mib)
            / u128::from(REFERENCE_WEIGHTS_MIB);
        Micros::try_from(ns.div_ceil(1_000)).unwrap_or(Micros::MAX)
    }

    /// How the executor serves it.
    pub fn profile(&self) -> FunctionProfile {
        FunctionProfile {
            tier: Tier::Oversubscribed,
            memory_mib: self.memory_mib(),
            saturation_milli: DECODE_SHARE_MILLI,
            batch_ppm: BATCH_PPM,
        }
    }
}

/// `x` scaled by `weights_mib` / the reference model's weights.
fn scale(x: u64, weights_mib: Mib) -> u64 {
    let v = u128::from(x) * u128::from(weights_mib) / u128::from(REFERENCE_WEIGHTS_MIB);
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// What to build from an Azure LLM trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlmSpec {
    /// Number of models.
    pub models: u32,
    /// Seed of sizes, popularity ranks and the request-to-model draw.
    pub seed: u64,
}

/// Longest service a request may take, µs (a day, as for the other traces).
const MAX_SERVICE_US: Micros = 86_400_000_000;

impl LlmSpec {
    /// The models, index order (seeded sizes and ranks).
    pub fn models(&self, rng: &mut Rng) -> Vec<LlmModel> {
        let n = self.models.max(1);
        let (lo, hi) = (WEIGHTS_MIB.0 as f64, WEIGHTS_MIB.1 as f64);
        let mut ranks: Vec<u32> = (1..=n).collect();
        rng.shuffle(&mut ranks);
        ranks
            .into_iter()
            .map(|rank| LlmModel {
                // Log-uniform: as many small models as large ones per octave.
                weights_mib: (lo * (hi / lo).powf(rng.unit())).round() as Mib,
                rank,
            })
            .collect()
    }

    /// Build the workload from the text of an Azure LLM inference CSV
    /// (`TIMESTAMP,ContextTokens,GeneratedTokens`); `name` names it.
    pub fn build(
        &self,
        name: &str,
        text: &str,
        params: &ServingParams,
    ) -> Result<ServingTrace, TraceError> {
        let mut lines = text.lines();
        let header = lines.next().unwrap_or("");
        let cols: Vec<&str> = header.trim().split(',').map(str::trim).collect();
        let col = |c: &str| cols.iter().position(|x| *x == c);
        let (Some(c_time), Some(c_ctx), Some(c_gen)) = (
            col("TIMESTAMP"),
            col("ContextTokens"),
            col("GeneratedTokens"),
        ) else {
            return Err(TraceError::UnknownFormat {
                header: header.to_string(),
            });
        };
        let mut rng = Rng::new(self.seed);
        let models = self.models(&mut rng);
        if let Some(m) = models
            .iter()
            .find(|m| m.memory_mib() > params.gpu_memory_mib)
        {
            return Err(TraceError::BadRow {
                line: 1,
                message: format!(
                    "a model of {} MiB does not fit a GPU of {} MiB",
                    m.memory_mib(),
                    params.gpu_memory_mib
                ),
            });
        }
        // Zipf CDF over ranks; by_rank[r - 1] = the model of rank r.
        let mut by_rank = vec![0u32; models.len()];
        for (i, m) in models.iter().enumerate() {
            by_rank[m.rank as usize - 1] = i as u32;
        }
        let mut cdf = Vec::with_capacity(models.len());
        let mut total = 0.0;
        for rank in 1..=models.len() {
            total += 1.0 / (rank as f64).powf(ZIPF_S);
            cdf.push(total);
        }
        let mut rows: Vec<(Micros, u32, Micros)> = Vec::new();
        for (k, line) in lines.enumerate() {
            let line_no = k + 2;
            if line.trim().is_empty() {
                continue;
            }
            let bad = |message: String| TraceError::BadRow {
                line: line_no,
                message,
            };
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let get = |i: usize| {
                fields
                    .get(i)
                    .copied()
                    .ok_or_else(|| bad(format!("missing column {}", cols[i])))
            };
            let at = parse_datetime_us(get(c_time)?)
                .ok_or_else(|| bad(format!("bad timestamp {:?}", fields[c_time])))?;
            let tokens = |i: usize| -> Result<u64, TraceError> {
                let v = get(i)?;
                v.parse().map_err(|_| bad(format!("bad token count {v:?}")))
            };
            let (ctx, gen) = (tokens(c_ctx)?, tokens(c_gen)?);
            let u = rng.unit();
            let rank = cdf
                .partition_point(|c| *c < u * total)
                .min(models.len() - 1);
            let f = by_rank[rank];
            let us = models[f as usize].solo_us(ctx, gen);
            if us > MAX_SERVICE_US {
                return Err(bad(format!(
                    "{ctx} context and {gen} generated tokens take over a day"
                )));
            }
            rows.push((at, f, us.max(1)));
        }
        if rows.is_empty() {
            return Err(TraceError::Empty);
        }
        rows.sort_by_key(|r| r.0);
        let t0 = rows[0].0;
        Ok(ServingTrace {
            name: format!("{name}(models={},seed={})", models.len(), self.seed),
            functions: models
                .iter()
                .enumerate()
                .map(|(i, m)| TraceFunction {
                    name: format!("llm{i:03}-{}mib-rank{}", m.weights_mib, m.rank),
                    profile: m.profile(),
                })
                .collect(),
            requests: rows
                .into_iter()
                .map(|(at, function, full_gpu_us)| TraceRequest {
                    arrival_us: at - t0,
                    function,
                    full_gpu_us,
                })
                .collect(),
            models_stay_resident: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> ServingParams {
        ServingParams::from_toml(
            "topology.toml",
            include_str!("../../../../configs/examples/topology.toml"),
        )
        .unwrap()
    }

    const CSV: &str = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
2023-11-16 18:15:46.6805900,374,44\n\
2023-11-16 18:15:50.9951690,396,109\n\
2023-11-16 18:15:51.2224670,879,55\n\
2023-11-16 18:15:51.3910170,91,16\n";

    #[test]
    fn the_reference_model_matches_the_measurements_it_comes_from() {
        let m = LlmModel {
            weights_mib: REFERENCE_WEIGHTS_MIB,
            rank: 1,
        };
        // First token: 16 ms at 128 input tokens, 133 ms at 2,048.
        assert!(m.solo_us(128, 1).abs_diff(16_000) <= 5);
        assert!(m.solo_us(2_048, 1).abs_diff(133_000) <= 5);
        // 101 tokens after a 128-token prompt: 100 decode steps at 104.9 tok/s.
        assert_eq!(m.solo_us(128, 101) - m.solo_us(128, 1), 953_300);
        // Batch 60: each step carries 59 more sequences, 1,928 tokens/s.
        let p = m.profile();
        let (step60, _) = p.batched(DECODE_STEP_US, DECODE_SHARE_MILLI, 59);
        let tok_s = 60.0 * 1e6 / step60 as f64;
        assert!((tok_s - 1_928.0).abs() < 5.0, "{tok_s}");
        // A half-size model is twice as fast.
        let half = LlmModel {
            weights_mib: REFERENCE_WEIGHTS_MIB / 2,
            ..m
        };
        let (h, f) = (half.solo_us(500, 200), m.solo_us(500, 200));
        assert!((2 * h).abs_diff(f) * 1_000 < f, "{h} vs {f}");
    }

    #[test]
    fn the_same_seed_gives_the_same_workload_and_sizes_are_mixed() {
        let spec = LlmSpec {
            models: 50,
            seed: 1,
        };
        let a = spec.build("conv", CSV, &params()).unwrap();
        assert_eq!(a, spec.build("conv", CSV, &params()).unwrap());
        assert_eq!(a.functions.len(), 50);
        assert_eq!(a.requests.len(), 4);
        assert_eq!(a.requests[1].arrival_us, 4_314_579);
        let other = LlmSpec { seed: 2, ..spec };
        assert_ne!(
            a.functions,
            other.build("conv", CSV, &params()).unwrap().functions
        );
        let mut rng = Rng::new(1);
        let models = spec.models(&mut rng);
        let small = models.iter().filter(|m| m.weights_mib < 2_048).count();
        let large = models.iter().filter(|m| m.weights_mib > 8_192).count();
        assert!(small >= 5 && large >= 5, "{small} small, {large} large");
        assert!(models
            .iter()
            .all(|m| (WEIGHTS_MIB.0..=WEIGHTS_MIB.1).contains(&m.weights_mib)));
    }

    #[test]
    fn popularity_is_zipf_over_ranks() {
        let mut csv = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
        for i in 0..20_000 {
            csv += &format!(
                "2023-11-16 18:{:02}:{:02}.0,100,10\n",
                i / 600 % 60,
                i / 10 % 60
            );
        }
        let spec = LlmSpec {
            models: 50,
            seed: 3,
        };
        let t = spec.build("x", &csv, &params()).unwrap();
        let mut rng = Rng::new(3);
        let models = spec.models(&mut rng);
        let mut counts = vec![0u32; 50];
        for r in &t.requests {
            counts[models[r.function as usize].rank as usize - 1] += 1;
        }
        // Zipf(1) over 50: rank 1 gets 1/H(50) ≈ 22 %, rank 50 ≈ 0.45 %.
        assert!((4_000..5_000).contains(&counts[0]), "{counts:?}");
        assert!(counts[0] > 20 * counts[49].max(1), "{counts:?}");
    }

    #[test]
    fn bad_rows_are_reported_with_their_line() {
        let csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,x,10\n";
        let spec = LlmSpec { models: 5, seed: 1 };
        assert_eq!(
            spec.build("a", csv, &params()).unwrap_err(),
            TraceError::BadRow {
                line: 2,
                message: "bad token count \"x\"".into()
            }
        );
        assert!(matches!(
            spec.build("a", "a,b\n", &params()),
            Err(TraceError::UnknownFormat { .. })
        ));
        let huge =
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,1,18446744073709551615\n";
        assert!(matches!(
            spec.build("a", huge, &params()),
            Err(TraceError::BadRow { line: 2, .. })
        ));
    }
}

#[cfg(test)]
mod sharing_tests {
    use super::*;
    use crate::sim::serving::{simulate, RunSpec, ServingPolicy};

    fn params() -> ServingParams {
        ServingParams::from_toml(
            "topology.toml",
            include_str!("../../../../configs/examples/topology.toml"),
        )
        .unwrap()
    }

    /// `n` requests (context 500, 200 generated) at time 0, request `i` on
    /// model `i % k`, every model of 4 GiB; slack large enough that all run.
    fn burst(n: u32, k: u32) -> ServingTrace {
        let m = LlmModel {
            weights_mib: 4_096,
            rank: 1,
        };
        ServingTrace {
            name: format!("burst({n},{k})"),
            functions: (0..k)
                .map(|i| TraceFunction {
                    name: format!("m{i}"),
                    profile: m.profile(),
                })
                .collect(),
            requests: (0..n)
                .map(|i| TraceRequest {
                    arrival_us: 0,
                    function: i % k,
                    full_gpu_us: m.solo_us(500, 200),
                })
                .collect(),
            models_stay_resident: true,
        }
    }

    fn run(trace: &ServingTrace, policy: ServingPolicy) -> crate::sim::serving::RunReport {
        simulate(
            trace,
            &params(),
            RunSpec {
                policy,
                static_slices: 1,
                gpus: 1,
                slack: 1_000.0,
            },
        )
    }

    #[test]
    fn co_resident_models_never_beat_one_gpus_throughput_for_the_same_tokens() {
        for n in [6, 12, 30] {
            let one = run(&burst(n, 1), ServingPolicy::Gshare);
            assert_eq!(one.met, n as u64);
            for k in 2..=6 {
                let shared = run(&burst(n, k), ServingPolicy::Gshare);
                assert_eq!(shared.met, n as u64, "n {n} k {k}");
                // The same tokens over k models (each step reads its own
                // model's weights) take at least as long on one GPU.
                assert!(
                    shared.span_us >= one.span_us,
                    "n {n} k {k}: {} < {}",
                    shared.span_us,
                    one.span_us
                );
            }
        }
    }

    #[test]
    fn dedicated_gpus_batch_one_models_requests_like_gshare() {
        let t = burst(12, 1);
        let swap = run(&t, ServingPolicy::ExclusiveSwap);
        let gshare = run(&t, ServingPolicy::Gshare);
        assert_eq!((swap.met, gshare.met), (12, 12));
        let solo = t.requests[0].full_gpu_us;
        assert!(swap.span_us < 2 * solo, "{} vs {solo}", swap.span_us);
    }
}
