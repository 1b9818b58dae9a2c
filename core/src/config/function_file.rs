//! Reading and validating a function file (the body of `POST /v1/functions`,
//! e.g. `configs/examples/function.toml`) with the reader of the topology
//! files: every mistake of the file at once, each with its line, column and
//! key path.
//!
//! ```text
//!   fn.toml ─▶ FunctionFile::from_toml ─▶ FunctionFile (keys as written; absent
//!                    │                     optional keys stay None: the API's defaults)
//!                    └─▶ Err(ConfigError) "fn.toml:4:14: memory_mib: must be from 1 to 16777216 (got 0)"
//! ```
//!
//! The checks are the ones the region's apply makes (`bounds::check_spec`
//! and the tier rules), run here so that a person sees all of them before
//! anything is sent; the region still checks again.

use super::error::{ConfigError, IssueKind};
use super::names::check_name;
use super::reader::{check_range, parse_document, quote, Field, Issues, TableReader};
use crate::bounds::{
    MAX_DEADLINE_MS, MAX_FULL_GPU_US, MAX_FUNCTION_COMPUTE_MILLI, MAX_FUNCTION_MEMORY_MIB,
    MAX_GPUS_PER_INSTANCE, MAX_IDLE_TIMEOUT_S, MAX_INSTANCES_PER_FUNCTION,
};
use crate::model::{PoolPreference, Runtime, Tier, WHOLE_GPU};
use std::collections::BTreeMap;
use std::str::FromStr;

/// A function's latency profile as written (`[latency]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionFileLatency {
    /// Service time on a whole GPU, µs.
    pub full_gpu_us: u64,
    /// Compute beyond which a request gets no faster, milli-GPU.
    pub saturation_milli: u32,
}

/// A checked function file. Optional keys that were absent are `None`, so
/// the API's defaults apply (one place for them: the region's deploy body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionFile {
    /// Name (per tenant).
    pub name: String,
    /// Serving runtime.
    pub runtime: Runtime,
    /// GPU memory footprint, MiB.
    pub memory_mib: u64,
    /// Compute slice, milli-GPU.
    pub compute_milli: u32,
    /// Sharing tier.
    pub tier: Tier,
    /// Per-request deadline, ms.
    pub deadline_ms: u64,
    /// Pool preference (`edge:<p>`, `center` or `any`; never a strict
    /// form: that is `strict_pool`).
    pub pool: Option<PoolPreference>,
    /// `strict_pool`: never place outside `pool` (`None`: absent, a
    /// preference).
    pub strict_pool: Option<bool>,
    /// Instances placed at deploy.
    pub min_instances: Option<u32>,
    /// Most instances.
    pub max_instances: Option<u32>,
    /// Idle time before scale-down, s.
    pub idle_timeout_s: Option<u64>,
    /// Latency profile.
    pub latency: Option<FunctionFileLatency>,
    /// The model its runtime serves (`org/model`).
    pub model: Option<String>,
    /// Arguments appended to the runtime's command.
    pub args: Vec<String>,
    /// Environment of the runtime.
    pub env: BTreeMap<String, String>,
}

impl FunctionFile {
    /// Parses and validates function file `file` whose text is `src`;
    /// every mistake is reported at once.
    pub fn from_toml(file: &str, src: &str) -> Result<Self, ConfigError> {
        let mut is = Issues::new(src);
        let Some(doc) = parse_document(src, &mut is) else {
            return Err(is.into_error(file));
        };
        let mut root = TableReader::root(&doc);
        let name = root.string(&mut is, "name", true);
        let runtime = root.string(&mut is, "runtime", true);
        let memory_mib = root.uint::<u64>(&mut is, "memory_mib", true);
        let compute_milli = root.uint::<u32>(&mut is, "compute_milli", true);
        let tier = root.string(&mut is, "tier", true);
        let deadline_ms = root.uint::<u64>(&mut is, "deadline_ms", true);
        let pool_written = root.has("pool");
        let pool = root.string(&mut is, "pool", false);
        let strict_pool = root.boolean(&mut is, "strict_pool", false);
        let min_instances = (
            root.has("min_instances"),
            root.uint::<u32>(&mut is, "min_instances", false),
        );
        let max_instances = (
            root.has("max_instances"),
            root.uint::<u32>(&mut is, "max_instances", false),
        );
        let idle_timeout_s = (
            root.has("idle_timeout_s"),
            root.uint::<u64>(&mut is, "idle_timeout_s", false),
        );
        let latency = root.table(&mut is, "latency", false).map(|mut t| {
            let full = t.uint::<u64>(&mut is, "full_gpu_us", true);
            let sat = t.uint::<u32>(&mut is, "saturation_milli", true);
            t.finish(&mut is);
            (full, sat)
        });
        let model = root.string(&mut is, "model", false);
        let args = root.strings(&mut is, "args", false);
        let env = root.string_table(&mut is, "env", false);
        root.finish(&mut is);

        // Meaning: names, words, ranges, the tier's rule, min ≤ max.
        let name = check_name(&mut is, &name);
        let runtime = word::<Runtime>(&mut is, &runtime);
        let tier_v = word::<Tier>(&mut is, &tier);
        let pool_v = pool_word(&mut is, &pool);
        // strict_pool needs a pool to keep to (a pool already reported
        // stays unjudged here).
        let no_pool = match (strict_pool.v, pool_written, &pool_v) {
            (Some(true), false, _) => Some("pool is absent (any)"),
            (Some(true), true, Some(PoolPreference::Any)) => Some("pool is \"any\""),
            _ => None,
        };
        if let Some(why) = no_pool {
            is.report(
                &strict_pool.at,
                IssueKind::Inconsistent,
                format!(
                    "{why}, and {}: write pool = \"edge:<pool>\" or \"center\"",
                    crate::model::ANY_NAMES_NO_POOL
                ),
                Some("true".to_string()),
            );
        }
        let memory_mib = check_range(&mut is, &memory_mib, 1, MAX_FUNCTION_MEMORY_MIB);
        let compute = compute(&mut is, &compute_milli, tier_v);
        let deadline_ms = check_range(&mut is, &deadline_ms, 1, MAX_DEADLINE_MS);
        let idle = optional(&mut is, &idle_timeout_s, 0, MAX_IDLE_TIMEOUT_S);
        let min = optional(&mut is, &min_instances, 0, MAX_INSTANCES_PER_FUNCTION);
        let max = optional(&mut is, &max_instances, 1, MAX_INSTANCES_PER_FUNCTION);
        if let (Some(Some(lo)), Some(Some(hi))) = (min, max) {
            if lo > hi {
                is.report(
                    &max_instances.1.at,
                    IssueKind::Inconsistent,
                    format!("must be at least min_instances ({lo})"),
                    Some(hi.to_string()),
                );
            }
        }
        let latency = latency.map(|(full, sat)| {
            let full = check_range(&mut is, &full, 0, MAX_FULL_GPU_US);
            let sat = check_range(&mut is, &sat, 1, WHOLE_GPU);
            (full, sat)
        });
        let (model, args, env) = serving(&mut is, model, args, env);
        if !is.is_empty() {
            return Err(is.into_error(file));
        }
        let latency = match latency {
            None => Some(None),
            Some((Some(full_gpu_us), Some(saturation_milli))) => Some(Some(FunctionFileLatency {
                full_gpu_us,
                saturation_milli,
            })),
            Some(_) => None,
        };
        match (
            name,
            runtime,
            memory_mib,
            compute,
            tier_v,
            deadline_ms,
            pool_v,
            strict_pool.v,
            min,
            max,
            idle,
            latency,
        ) {
            (
                Some(name),
                Some(runtime),
                Some(memory_mib),
                Some(compute_milli),
                Some(tier),
                Some(deadline_ms),
                pool,
                strict_pool,
                Some(min_instances),
                Some(max_instances),
                Some(idle_timeout_s),
                Some(latency),
            ) => Ok(FunctionFile {
                name,
                runtime,
                memory_mib,
                compute_milli,
                tier,
                deadline_ms,
                pool,
                strict_pool,
                min_instances,
                max_instances,
                idle_timeout_s,
                latency,
                model,
                args,
                env,
            }),
            _ => Err(is.into_error(file)),
        }
    }
}

/// `model`, `args` and `env`, each checked as the region checks them
/// ([`crate::serving`]), every problem reported with its key.
fn serving(
    is: &mut Issues<'_>,
    model: Field<String>,
    args: Vec<Field<String>>,
    env: Vec<(String, Field<String>)>,
) -> (Option<String>, Vec<String>, BTreeMap<String, String>) {
    use crate::serving::{check_arg, check_env, check_model, MAX_ARGS, MAX_ENV};
    if let Some(m) = &model.v {
        if let Err(e) = check_model(m) {
            is.report(&model.at, IssueKind::Invalid, e.reason, Some(quote(m)));
        }
    }
    if args.len() > MAX_ARGS {
        let at = args[MAX_ARGS].at.clone();
        is.report(
            &at,
            IssueKind::OutOfRange,
            format!("at most {MAX_ARGS} arguments"),
            None,
        );
    }
    if env.len() > MAX_ENV {
        let at = env[MAX_ENV].1.at.clone();
        is.report(
            &at,
            IssueKind::OutOfRange,
            format!("at most {MAX_ENV} variables"),
            None,
        );
    }
    let mut out_args = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if let Some(v) = &a.v {
            match check_arg(i, v) {
                Ok(()) => out_args.push(v.clone()),
                Err(e) => is.report(&a.at, IssueKind::Invalid, e.reason, Some(quote(v))),
            }
        }
    }
    let mut out_env = BTreeMap::new();
    for (k, f) in &env {
        if let Some(v) = &f.v {
            match check_env(k, v) {
                Ok(()) => {
                    out_env.insert(k.clone(), v.clone());
                }
                Err(e) => is.report(&f.at, IssueKind::Invalid, e.reason, Some(quote(v))),
            }
        }
    }
    (model.v, out_args, out_env)
}

/// An enum word (`tier = "burstable"`) parsed with its `FromStr`, which
/// names the accepted spellings.
fn word<T>(is: &mut Issues<'_>, f: &Field<String>) -> Option<T>
where
    T: FromStr<Err = crate::model::ParseEnumError>,
{
    let s = f.v.as_ref()?;
    match s.parse::<T>() {
        Ok(v) => Some(v),
        Err(e) => {
            let message = format!(
                "unknown {} (expected one of: {})",
                e.what,
                e.expected.join(", ")
            );
            is.report(&f.at, IssueKind::Invalid, message, Some(quote(s)));
            None
        }
    }
}

/// `pool`: `edge:<p>`, `center` or `any`. The strict forms the state
/// writes (`strict:edge:<p>`, `strict:center`) are refused here, so that a
/// file says it one way: `strict_pool = true`.
fn pool_word(is: &mut Issues<'_>, f: &Field<String>) -> Option<PoolPreference> {
    let p = word::<PoolPreference>(is, f)?;
    if p.is_strict() {
        is.report(
            &f.at,
            IssueKind::Invalid,
            format!(
                "a pool preference is edge:<pool>, center or any; for a strict pool write \
                 pool = \"{}\" with strict_pool = true",
                p.preferred()
            ),
            f.v.as_deref().map(quote),
        );
        return None;
    }
    Some(p)
}

/// An optional integer in `lo..=hi`: `Some(None)` when absent, `None` when
/// present but unusable (reported).
fn optional<T>(
    is: &mut Issues<'_>,
    (written, f): &(bool, Field<T>),
    lo: T,
    hi: T,
) -> Option<Option<T>>
where
    T: Copy + PartialOrd + std::fmt::Display,
{
    if !written {
        return Some(None);
    }
    check_range(is, f, lo, hi).map(Some)
}

/// `compute_milli`: whole GPUs for `exclusive`, at most one GPU otherwise.
fn compute(is: &mut Issues<'_>, f: &Field<u32>, tier: Option<Tier>) -> Option<u32> {
    let v = check_range(is, f, 1, MAX_FUNCTION_COMPUTE_MILLI)?;
    let got = Some(is.written_or(&f.at, v));
    match tier? {
        Tier::Exclusive if v % WHOLE_GPU != 0 || v / WHOLE_GPU > MAX_GPUS_PER_INSTANCE => {
            is.report(
                &f.at,
                IssueKind::Inconsistent,
                format!(
                    "an exclusive function takes 1 to {MAX_GPUS_PER_INSTANCE} whole GPUs (a multiple of 1000)"
                ),
                got,
            );
            None
        }
        t if t != Tier::Exclusive && v > WHOLE_GPU => {
            is.report(
                &f.at,
                IssueKind::Inconsistent,
                format!("a {t} function takes 1 to 1000 milli-GPU of one GPU"),
                got,
            );
            None
        }
        _ => Some(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../../configs/examples/function.toml");

    #[test]
    fn the_example_parses() {
        let f = FunctionFile::from_toml("function.toml", EXAMPLE).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.name, "llama-8b-chat");
        assert_eq!(f.tier, Tier::Guaranteed);
        assert_eq!(f.max_instances, Some(4));
        assert_eq!(
            f.latency,
            Some(FunctionFileLatency {
                full_gpu_us: 250_000,
                saturation_milli: 700
            })
        );
    }

    #[test]
    fn optional_keys_stay_absent() {
        let src = "name = \"f\"\nruntime = \"custom\"\nmemory_mib = 1\ncompute_milli = 1\n\
                   tier = \"burstable\"\ndeadline_ms = 5\n";
        let f = FunctionFile::from_toml("f.toml", src).unwrap();
        assert_eq!(f.strict_pool, None);
        assert_eq!(
            (
                f.pool,
                f.min_instances,
                f.max_instances,
                f.idle_timeout_s,
                f.latency
            ),
            (None, None, None, None, None)
        );
    }

    #[test]
    fn every_mistake_is_reported_at_once_with_its_place() {
        let src = "name = \"bad name\"\n\
                   runtime = \"vlm\"\n\
                   memory_mb = 10\n\
                   compute_milli = 1500\n\
                   tier = \"guaranteed\"\n\
                   deadline_ms = 0\n\
                   pool = \"edge:\"\n\
                   min_instances = 3\n\
                   max_instances = 2\n\
                   [latency]\n\
                   saturation_milli = 2000\n";
        let e = FunctionFile::from_toml("fn.toml", src).unwrap_err();
        let text = e.to_string();
        for want in [
            "fn.toml:1:8: name: a name is",
            "fn.toml:2:11: runtime: unknown runtime (expected one of: vllm",
            "fn.toml:3:1: memory_mb: unknown key",
            "fn.toml:1:1: memory_mib: missing required key",
            "fn.toml:4:17: compute_milli: a guaranteed function takes 1 to 1000 milli-GPU",
            "fn.toml:6:15: deadline_ms: must be from 1 to 86400000 (got 0)",
            "fn.toml:7:8: pool: unknown pool preference",
            "fn.toml:9:17: max_instances: must be at least min_instances (3) (got 2)",
            "latency.full_gpu_us: missing required key",
            "fn.toml:11:20: latency.saturation_milli: must be from 1 to 1000 (got 2000)",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert_eq!(e.issues.len(), 10, "{text}");
    }

    const BASE: &str = "name = \"f\"\nruntime = \"custom\"\nmemory_mib = 1\ncompute_milli = 1\n\
                        tier = \"burstable\"\ndeadline_ms = 5\n";

    #[test]
    fn strict_pool_keeps_a_function_in_its_pool() {
        let parse = |extra: &str| FunctionFile::from_toml("f.toml", &format!("{BASE}{extra}"));
        let f = parse("pool = \"edge:edge-a\"\nstrict_pool = true\n").unwrap();
        assert_eq!(
            (f.pool, f.strict_pool),
            (Some(PoolPreference::Edge("edge-a".into())), Some(true))
        );
        let f = parse("pool = \"center\"\nstrict_pool = true\n").unwrap();
        assert_eq!(
            (f.pool, f.strict_pool),
            (Some(PoolPreference::Center), Some(true))
        );
        let f = parse("pool = \"any\"\nstrict_pool = false\n").unwrap();
        assert_eq!(
            (f.pool, f.strict_pool),
            (Some(PoolPreference::Any), Some(false))
        );
        let f = parse("strict_pool = false\n").unwrap();
        assert_eq!((f.pool, f.strict_pool), (None, Some(false)));
        assert_eq!(parse("").unwrap().strict_pool, None);

        let e = parse("pool = \"any\"\nstrict_pool = true\n").unwrap_err();
        assert_eq!(e.issues.len(), 1, "{e}");
        assert!(
            e.to_string().contains(
                "f.toml:8:15: strict_pool: pool is \"any\", and any names no pool: \
                 write pool = \"edge:<pool>\" or \"center\" (got true)"
            ),
            "{e}"
        );
        let e = parse("strict_pool = true\n").unwrap_err();
        assert_eq!(e.issues.len(), 1, "{e}");
        assert!(
            e.to_string()
                .contains("f.toml:7:15: strict_pool: pool is absent (any), and any names no pool"),
            "{e}"
        );
    }

    #[test]
    fn strict_pool_mistakes_are_reported_at_once_with_the_others() {
        // A wrong type, the state's strict spelling in `pool`, and an
        // unrelated mistake: all three, each at its key.
        let src = format!(
            "{BASE}pool = \"strict:edge:edge-a\"\nstrict_pool = \"yes\"\nmin_instances = -1\n"
        );
        let e = FunctionFile::from_toml("f.toml", &src).unwrap_err();
        let text = e.to_string();
        for want in [
            "f.toml:7:8: pool: a pool preference is edge:<pool>, center or any; for a strict \
             pool write pool = \"edge:edge-a\" with strict_pool = true (got \"strict:edge:edge-a\")",
            "f.toml:8:15: strict_pool: expected true or false, found a string",
            "f.toml:9:17: min_instances:",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert_eq!(e.issues.len(), 3, "{text}");
        // `strict:center` and a `strict_pool` beside a bad pool: only the
        // pool is reported (strict_pool is judged against a usable pool).
        let src = format!("{BASE}pool = \"strict:center\"\nstrict_pool = true\n");
        let e = FunctionFile::from_toml("f.toml", &src).unwrap_err();
        assert_eq!(e.issues.len(), 1, "{e}");
        assert!(
            e.to_string()
                .contains("write pool = \"center\" with strict_pool = true"),
            "{e}"
        );
        let src = format!("{BASE}pool = \"edge:\"\nstrict_pool = true\n");
        let e = FunctionFile::from_toml("f.toml", &src).unwrap_err();
        assert_eq!(e.issues.len(), 1, "{e}");
        assert!(
            e.to_string().contains("pool: unknown pool preference"),
            "{e}"
        );
    }

    #[test]
    fn model_args_and_env_are_read_and_each_mistake_is_reported_at_its_key() {
        let src = format!(
            "{BASE}model = \"Qwen/Qwen2.5-0.5B-Instruct\"\nargs = [\"--max-model-len\", \"4096\"]\n\
             [env]\nHF_HOME = \"/cache\"\n"
        );
        let f = FunctionFile::from_toml("f.toml", &src).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.model.as_deref(), Some("Qwen/Qwen2.5-0.5B-Instruct"));
        assert_eq!(f.args, ["--max-model-len", "4096"]);
        assert_eq!(f.env["HF_HOME"], "/cache");
        let f = FunctionFile::from_toml("f.toml", BASE).unwrap();
        assert_eq!((f.model, f.args.len(), f.env.len()), (None, 0, 0));

        let src = format!(
            "{BASE}model = \"/etc/passwd\"\nargs = [\"ok\", 3, \"\"]\n[env]\n\"A-B\" = \"x\"\nN = 1\n"
        );
        let e = FunctionFile::from_toml("f.toml", &src).unwrap_err();
        let text = e.to_string();
        for want in [
            "f.toml:7:9: model: \"/etc/passwd\": every `/`-separated part must start with",
            "f.toml:8:15: args[1]: expected a string, found an integer",
            "f.toml:8:18: args[2]: must be 1 to 1024 bytes, got 0",
            "env.A-B: a variable name is a letter or `_`",
            "f.toml:11:5: env.N: expected a string",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert_eq!(e.issues.len(), 5, "{text}");
    }

    #[test]
    fn an_exclusive_function_takes_whole_gpus() {
        let src = |c: u32| {
            format!(
                "name = \"f\"\nruntime = \"custom\"\nmemory_mib = 1\ncompute_milli = {c}\n\
                 tier = \"exclusive\"\ndeadline_ms = 5\n"
            )
        };
        assert!(FunctionFile::from_toml("f.toml", &src(2000)).is_ok());
        let e = FunctionFile::from_toml("f.toml", &src(1500)).unwrap_err();
        assert!(e.to_string().contains("whole GPUs"), "{e}");
    }
}
